"""Machines whose clocks disagree, on one PostgreSQL ledger: real ``tether worker`` processes whose
machine clock is 10 minutes fast or slow (tests/proc_clock.py shifts ``SystemClock`` in the worker,
as a broken NTP would) never reclaim a live job, keep their own jobs alive with heartbeats, still
reclaim a dead worker's job once its lock is ``--lock-timeout`` old by the database's clock, and
enqueue each schedule slot once, when it is due by the database's clock.

A dead worker is played by the test: it claims a job through a coordinator whose clock (a shifted
``SystemClock``) is as wrong as the machine's, and never heartbeats it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import drop_ledger
from tether import Coordinator
from tether.clock import SystemClock
from tether.jobtypes import Registry, default_registry
from tether.ledger.status import JobStatus
from tether.observe import schedules
from workerkit import REPO, TETHER, pj

pytestmark = pytest.mark.slow


SKEW = 600.0  # seconds: ten minutes
LOCK = 3.0  # --lock-timeout: heartbeats every 0.75 s
SWEEP = LOCK / 2  # how often each worker sweeps
DEADLINE = 30.0  # for a worker to reach a point it must reach, on a busy machine


class ShiftedClock(SystemClock):
    """The machine's clock of a machine ``shift`` seconds fast (negative: slow)."""

    def __init__(self, shift: float) -> None:
        self.shift = timedelta(seconds=shift)

    def now(self) -> datetime:  # an instance's own reading, shifted
        return datetime.now(UTC) + self.shift


class Proc:
    """One ``tether worker`` subprocess; its event lines and errors go to one file."""

    def __init__(self, popen: subprocess.Popen[bytes], output: Path, shift: float) -> None:
        self.popen, self.output, self.shift = popen, output, shift

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def events(self, name: str) -> list[dict]:
        lines = self.text().split("\n")[:-1]  # complete lines only: it may be mid-write
        return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e["event"] == name]


def registry() -> Registry:
    reg = default_registry()
    pj.register(reg)
    return reg


@pytest.fixture
def ledger(pg_database: str) -> str:
    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        drop_ledger(conn)
    engine.dispose()
    return pg_database


@pytest.fixture
def db_now(ledger: str) -> Iterator[Callable[[], datetime]]:
    """The database's own clock, read by the test."""
    engine = sa.create_engine(ledger)

    def now() -> datetime:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()

    yield now
    engine.dispose()


@pytest.fixture
def start_worker(tmp_path: Path, ledger: str, root: Path) -> Iterator[Callable[..., Proc]]:
    """``start(shift, *types_modules)``: a ``tether worker --lock-timeout LOCK`` whose machine
    clock is ``shift`` seconds off; stopped (SIGTERM, then SIGKILL) at teardown."""
    procs: list[Proc] = []
    Coordinator.open(ledger, root=root, registry=registry()).close()  # what `tether init` does; workers need it

    def start(shift: float, imports: tuple[str, ...] = ("tests.proc_jobtypes",)) -> Proc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        env["TETHER_TEST_CLOCK_SHIFT"] = str(shift)
        argv = [*TETHER, "--db", ledger, "--root", str(root), "--import", "tests.proc_clock"]
        for module in imports:
            argv += ["--import", module]
        argv += ["worker", "--lock-timeout", str(LOCK), "--poll-interval", "0.2", "--shutdown-grace", "0"]
        output = tmp_path / f"worker-{len(procs)}.out"
        with open(output, "wb") as out:
            popen = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append(Proc(popen, output, shift))
        return procs[-1]

    yield start
    stop(procs)


def stop(procs: list[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.popen.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait()


def wait_for(condition: Callable[[], object], what: str, procs: Sequence[Proc] = ()) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        for p in procs:
            assert p.popen.poll() is None, f"a worker exited ({p.popen.returncode}):\n{p.text()[-2000:]}"
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {DEADLINE}s waiting for {what}")
        time.sleep(0.05)


def wait_up(proc: Proc) -> None:
    """Wait until ``proc`` runs its loops (its sweeps start then). A loaded machine can take
    seconds to start a worker: a window of "no live job reclaimed" means nothing until every
    worker in it sweeps."""
    wait_for(lambda: proc.events("worker_started"), f"the worker {proc.shift:+.0f} s off to start", [proc])


def runs(log: Path) -> list[str]:
    """The pids that started a slow job (one line per run)."""
    return [line.split()[1] for line in log.read_text().splitlines()] if log.exists() else []


def claim_and_die(ledger: str, root: Path, job_id: str, shift: float) -> None:
    """A worker on a machine ``shift`` seconds off claims ``job_id`` and dies: no heartbeat follows."""
    with Coordinator.open(ledger, root=root, registry=registry(), clock=ShiftedClock(shift)) as ghost:
        [claimed] = ghost.queue.claim(f"dead:{shift:+.0f}:0", limit=1)
    assert claimed.id == job_id


def watch_reclaims(c: Coordinator, db_now: Callable[[], datetime], ghosts: dict[str, datetime]) -> dict[str, datetime]:
    """Poll until every ghost job left its dead worker; returns when the test first saw each
    one gone, by the database's clock."""
    seen: dict[str, datetime] = {}

    def gone() -> bool:
        for job_id in ghosts:
            if job_id not in seen and not (c.get(job_id).locked_by or "").startswith("dead:"):
                seen[job_id] = db_now()
        return len(seen) == len(ghosts)

    wait_for(gone, "the dead worker's jobs to be reclaimed")
    return seen


def hold_live_jobs(c: Coordinator, db_now: Callable[[], datetime], live: dict[str, Proc], until: datetime) -> None:
    """Until the database's clock reads ``until``, each live job stays claimed by its runner, on
    its first attempt (checked every 50 ms: the sweeps of every worker run in this window)."""
    while db_now() < until:
        for job_id, runner in live.items():
            job = c.get(job_id)
            assert job.status is JobStatus.CLAIMED and job.attempts == 1, (
                f"live job of the worker {runner.shift:+.0f} s off was reclaimed: {job.status.value}, "
                f"attempt {job.attempts}, locked by {job.locked_by}"
            )
        time.sleep(0.05)


def test_a_worker_ten_minutes_fast_never_reclaims_a_live_job_of_another(
    tmp_path: Path, ledger: str, root: Path, db_now: Callable[[], datetime], start_worker: Callable[..., Proc]
) -> None:
    """Issue 33, item 1, with a 3 s lock timeout and a job of a few seconds."""
    started, release, log = tmp_path / "started", tmp_path / "release", tmp_path / "effects.log"
    with Coordinator.open(ledger, root=root, registry=registry()) as c:
        ghost = c.enqueue(pj.AppendId(log=str(log))).job.id
        claimed_by_ghost = db_now()
        claim_and_die(ledger, root, ghost, 0)
        live = c.enqueue(pj.Slow(started=str(started), release=str(release))).job.id

        runner = start_worker(0)
        wait_for(lambda: runs(started), "the live job to start", [runner])
        fast = start_worker(SKEW)
        wait_up(fast)
        fast_up = db_now()
        reclaimed = watch_reclaims(c, db_now, {ghost: claimed_by_ghost})
        # Long enough for two sweeps of every worker once all were up and the ghost's lock stale.
        hold_live_jobs(c, db_now, {live: runner}, max(reclaimed[ghost], fast_up) + timedelta(seconds=2 * SWEEP))
        release.touch()
        wait_for(lambda: c.get(live).status is JobStatus.COMPLETED, "the live job to complete", [runner, fast])
        wait_for(lambda: c.get(ghost).status is JobStatus.COMPLETED, "the dead worker's job to complete")
        done, ghost_job = c.get(live), c.get(ghost)
    stop([runner, fast])

    assert runs(started) == [str(runner.popen.pid)], "the live job's handler ran more than once"
    assert done.attempts == 1
    assert runner.events("lost_lease") == [] and fast.events("lost_lease") == []
    assert [e["job_id"] for p in (runner, fast) for e in p.events("reclaimed")] == [ghost]
    # The dead worker's job went back once its lock was LOCK seconds old by the database's clock.
    assert (reclaimed[ghost] - claimed_by_ghost).total_seconds() >= LOCK
    # Run again once (the dead worker's attempt counts: it died running that job alone).
    assert ghost_job.attempts == 2 and log.read_text().count(ghost) == 1
    # The fast machine said how wrong its clock is; the other one had nothing to say.
    [skew] = fast.events("clock_skew")
    assert abs(skew["machine_ahead_s"] - SKEW) < 5
    assert runner.events("clock_skew") == []


def test_workers_ten_minutes_fast_or_slow_keep_their_jobs_and_reclaim_only_dead_ones(
    tmp_path: Path, ledger: str, root: Path, db_now: Callable[[], datetime], start_worker: Callable[..., Proc]
) -> None:
    """A fast and a slow machine each run a live job (their heartbeats keep it) and each had a
    worker die holding a job; a third, idle worker on a right clock runs what is reclaimed. Every
    worker sweeps: only the dead workers' jobs go back, each once its lock is LOCK seconds old."""
    log, release = tmp_path / "effects.log", tmp_path / "release"
    # Ready before the slow machine's clock says so: its worker can claim it however wrong it is.
    past = datetime.now(UTC) - timedelta(hours=1)
    with Coordinator.open(ledger, root=root, registry=registry()) as c:
        ghosts: dict[str, datetime] = {}
        for shift in (SKEW, -SKEW):
            ghost = c.enqueue(pj.AppendId(log=str(log)), run_at=past).job.id
            ghosts[ghost] = db_now()
            claim_and_die(ledger, root, ghost, shift)
        live: dict[str, tuple[Proc, Path]] = {}
        for shift in (SKEW, -SKEW):
            started = tmp_path / f"started{shift:+.0f}"
            job_id = c.enqueue(pj.Slow(started=str(started), release=str(release)), run_at=past).job.id
            live[job_id] = (start_worker(shift), started)
            wait_for(lambda: runs(started), f"the job of the worker {shift:+.0f} s off to start")  # noqa: B023  # waited for at once
        spare = start_worker(0)
        procs = [*(runner for runner, _ in live.values()), spare]
        wait_up(spare)  # the runners are up: each claimed its job
        spare_up = db_now()
        reclaimed = watch_reclaims(c, db_now, ghosts)
        until = max(*reclaimed.values(), spare_up) + timedelta(seconds=2 * SWEEP)
        hold_live_jobs(c, db_now, {job_id: runner for job_id, (runner, _) in live.items()}, until)
        release.touch()
        wait_for(lambda: all(c.get(j).status is JobStatus.COMPLETED for j in [*live, *ghosts]), "every job", procs)
        jobs = {job_id: c.get(job_id) for job_id in [*live, *ghosts]}
    stop(procs)

    for job_id, (runner, started) in live.items():
        assert runs(started) == [str(runner.popen.pid)], "a live job's handler ran more than once"
        assert jobs[job_id].attempts == 1
    assert [p.events("lost_lease") for p in procs] == [[], [], []]
    assert sorted(e["job_id"] for p in procs for e in p.events("reclaimed")) == sorted(ghosts)
    for ghost, claimed in ghosts.items():
        assert (reclaimed[ghost] - claimed).total_seconds() >= LOCK, "a dead worker's job went back too early"
        assert jobs[ghost].attempts == 2 and log.read_text().count(ghost) == 1
    # Each machine reported its own clock's error once; the right one had nothing to say.
    assert [[round(e["machine_ahead_s"] / 60) for e in p.events("clock_skew")] for p in procs] == [[10], [-10], []]


def test_each_schedule_slot_is_enqueued_once_when_due_whichever_machine_fires_it(
    ledger: str, start_worker: Callable[..., Proc]
) -> None:
    """Two workers declare an every-second schedule (tests/proc_schedules.py), one machine 10
    minutes fast, one 10 minutes slow: each slot is enqueued once, none before it is due by the
    database's clock, none skipped."""
    engine = sa.create_engine(ledger)
    enqueued = sa.text("SELECT clock_timestamp(), max(run_at), count(*) FROM tether_jobs WHERE type = 'tick'")
    procs = [start_worker(shift, ("tests.proc_schedules",)) for shift in (SKEW, -SKEW)]
    slots_wanted = 4  # once both machines fire them

    def count() -> int:
        with engine.connect() as conn:
            now, latest, n = conn.execute(enqueued).one()
        if latest is not None:
            early = (latest - now).total_seconds()
            assert early < 0.5, f"slot {latest} enqueued {early:.1f} s before it is due"
        return int(n)

    try:
        for p in procs:
            wait_up(p)
        first = count()
        wait_for(lambda: count() >= first + slots_wanted, f"{slots_wanted} more slots", procs)
    finally:
        stop(procs)
        keys = Counter(str(j.idempotency_key) for j in schedules.runs(engine, "every-second", limit=None))
        engine.dispose()
    slots = sorted(datetime.fromisoformat(k.rpartition("@")[2]) for k in keys)  # keys read schedule:NAME@SLOT
    assert set(keys.values()) == {1}, [k for k, n in keys.items() if n > 1]
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]  # none skipped
    fired = [e for p in procs for e in p.events("schedule_fired")]
    assert sum(e["slots"] for e in fired) == len(keys)  # each slot by one machine only
    assert [[round(e["machine_ahead_s"] / 60) for e in p.events("clock_skew")] for p in procs] == [[10], [-10]]
