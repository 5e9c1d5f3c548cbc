"""A worker process paused (SIGSTOP) for longer than the lock timeout, then woken (SIGCONT), as a
VM pause or a long garbage collection would do, on SQLite and PostgreSQL: another worker takes
its job; the paused one, once woken, overwrites nothing a newer job on the target wrote, records
no outcome for the job it lost (its fenced transitions fail: ``lost_lease``), and the file
effects on the target stay in enqueue order.

Three jobs: J1 writes v1 to ``t/a.json``; J0 writes another file, so that worker A claims the two
in one batch (the stale sweep then gives the batch's attempts back: B's attempt has A's number,
and only the worker's name in the fence tells them apart); J2, enqueued after J1, writes v2 to
``t/a.json`` and waits for J1 (order per target). Worker A stops itself at one point of J1's
run (tests/proc_pause.py); worker B starts, reclaims J1 once its lock is stale and runs it; A is
woken; both drain and stop. Every rename over a data file is logged by the process that did it.
"""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from tether import Coordinator
from tether.jobtypes import CreateFile, default_registry, render
from tether.ledger.status import JobStatus
from tether.reconcile.check import reconcile
from workerkit import WorkerProc, start_worker, wait_for

pytestmark = pytest.mark.slow

LOCK_TIMEOUT = 1.0
ARGS = ("--lock-timeout", str(LOCK_TIMEOUT), "--poll-interval", "0.05")
TARGET = "t/a.json"
V1 = CreateFile(path=TARGET, content={"version": 1}, overwrite=True)
V2 = CreateFile(path=TARGET, content={"version": 2}, overwrite=True)
OTHER = CreateFile(path="t/other.json", content={"companion": True})


@dataclass
class Run:
    """One pause run: the ledger, the data root, the jobs and the two workers."""

    db: str
    root: Path
    tmp: Path
    coordinator: Coordinator
    j1: str = ""
    j0: str = ""
    j2: str = ""
    a: WorkerProc | None = None
    b: WorkerProc | None = None

    @property
    def effects(self) -> Path:
        return self.tmp / "effects.log"

    def worker(self, name: str, env: dict[str, str] | None = None, args: tuple[str, ...] = ARGS) -> WorkerProc:
        return start_worker(
            self.db,
            self.root,
            self.tmp / f"{name}.out",
            *args,
            env={"TETHER_TEST_EFFECT_LOG": str(self.effects), **(env or {})},
        )

    def status(self, job_id: str) -> JobStatus:
        return self.coordinator.get(job_id).status

    def writes(self) -> list[tuple[int, int]]:
        """(pid, version) of each rename over the target, in the order they happened."""
        versions = {hashlib.sha256(render(p)).hexdigest(): n for n, p in ((1, V1), (2, V2))}
        path = str(self.root.resolve() / TARGET)
        out = []
        for line in self.effects.read_text().splitlines():
            pid, kind, where, *digest = line.split(" ")
            if kind == "write" and where == path:
                out.append((int(pid), versions[digest[0]]))
        return out


@pytest.fixture
def run(db_url: str, root: Path, tmp_path: Path) -> Iterator[Run]:
    with Coordinator.open(db_url, root=root, registry=default_registry()) as c:
        r = Run(db_url, root, tmp_path, c)
        yield r
        for w in (r.a, r.b):
            if w is not None:
                w.kill()


def _lock_waiter(root: Path) -> bool:
    """Whether some process waits for a path lock of ``root`` (a blocked entry in /proc/locks)."""
    try:
        inode = (root / ".tether" / "locks" / "paths.lock").stat().st_ino
    except FileNotFoundError:
        return False  # no path lock was ever taken
    return any("->" in line and f":{inode} " in line for line in Path("/proc/locks").read_text().splitlines())


def _stale_for_a_while(r: Run) -> bool:
    """J1's lock is twice the lock timeout old: every other worker's sweep has found it stale."""
    job = r.coordinator.get(r.j1)
    assert job.status is JobStatus.CLAIMED and job.locked_at is not None
    return datetime.now(UTC) > job.locked_at + timedelta(seconds=2 * LOCK_TIMEOUT)


def _waits_on_a_row_lock(r: Run) -> bool:
    """PostgreSQL: a session of this database waits for a row lock (B's sweep, on J1's row)."""
    with r.coordinator.engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def _paused_then_woken(r: Run, point: str) -> None:
    """A claims J1 and J0 and stops at ``point``; B starts and takes what it can; A is woken;
    once J2 is done both are stopped with SIGTERM and must exit cleanly."""
    r.j1 = r.coordinator.enqueue(V1, max_attempts=5).id
    r.j0 = r.coordinator.enqueue(OTHER, max_attempts=5).id
    r.j2 = r.coordinator.enqueue(V2, max_attempts=5).id
    marker = r.tmp / "stopped"
    r.a = a = r.worker(
        "a", {"TETHER_TEST_STOP_AT": point, "TETHER_TEST_STOP_MARKER": str(marker), "TETHER_TEST_STOP_PATH": TARGET}
    )
    wait_for(lambda: marker.exists() and a.stopped(), f"worker A to stop itself at {point}")
    assert marker.read_text() == f"{point} {a.pid}"
    claimed = r.coordinator.get(r.j1)
    assert claimed.status is JobStatus.CLAIMED and claimed.attempts == 1
    assert r.coordinator.get(r.j0).locked_by == claimed.locked_by  # one batch
    r.b = b = r.worker("b")
    if point in ("handler", "before_commit"):
        wait_for(lambda: r.status(r.j2) is JobStatus.COMPLETED, "B to run J1, J0 and J2")
    elif point in ("lease_check", "rename"):
        # B runs J1 and waits for the path lock A holds (or, were the lock not taken, runs J2 too).
        wait_for(
            lambda: (
                r.status(r.j2) is JobStatus.COMPLETED
                or (r.coordinator.get(r.j1).locked_by not in (None, claimed.locked_by) and _lock_waiter(r.root))
            ),
            "B to take J1 and wait for the path lock",
        )
    else:  # in_commit: nobody can take J1 while A holds the write lock (or its row's lock)
        wait_for(lambda: _stale_for_a_while(r), "J1's lock to be stale twice over")
        wait_for(lambda: b.events("worker_started"), "B to start", timeout=10)
        if "postgresql" in r.db:
            wait_for(lambda: _waits_on_a_row_lock(r), "B's sweep to wait for J1's row lock")
    assert a.stopped(), "A stayed stopped"
    a.popen.send_signal(signal.SIGCONT)
    wait_for(lambda: r.status(r.j2) is JobStatus.COMPLETED, "every job to complete once A is woken")
    for w in (a, b):
        w.popen.send_signal(signal.SIGTERM)
    for w in (a, b):
        code, text = w.wait(), w.text()
        assert code == 0 and "Traceback" not in text, text[-3000:]


@pytest.mark.parametrize(
    ("point", "a_writes"),
    [
        pytest.param("handler", False, id="mid-handler-before-the-path-lock"),
        pytest.param("lease_check", False, id="mid-handler-holding-the-path-lock"),
        pytest.param("rename", True, id="mid-write-holding-the-path-lock-lease-confirmed"),
        pytest.param("before_commit", True, id="mid-commit-before-the-group-commit"),
    ],
)
def test_a_paused_worker_woken_after_its_job_was_taken_writes_nothing_stale_and_records_no_outcome(
    run: Run, point: str, a_writes: bool
) -> None:
    _paused_then_woken(run, point)
    assert run.a is not None and run.b is not None
    a, b = run.a, run.b
    # The effects on the target: v1 once, then v2 once, in enqueue order. A writes v1 only when
    # it confirmed its lease (under the path lock) before the pause; it then lands before v2.
    writes = run.writes()
    assert [version for _, version in writes] == [1, 2]
    assert writes[0][0] == (a.pid if a_writes else b.pid)
    assert (run.root / TARGET).read_bytes() == render(V2)
    # A records nothing for the attempts it lost: each fenced transition it tried failed, and it
    # said so. J1 is B's; J0 (back to pending, claimed alone) went to whichever worker came first.
    assert {e["job_id"] for e in a.events("lost_lease")} >= {run.j1, run.j0}
    ends = [e["event"] for e in a.events(job_id=run.j1) if e["event"] not in ("claimed", "lost_lease")]
    assert ends == [], f"A recorded {ends} for J1"
    assert [e["event"] for e in b.events("completed", run.j1)] == ["completed"]
    assert len(a.events("completed", run.j0) + b.events("completed", run.j0)) == 1
    assert [e["event"] for e in a.events(job_id=run.j0)][:2] == ["claimed", "lost_lease"]
    j1 = run.coordinator.get(run.j1)
    assert j1.status is JobStatus.COMPLETED
    assert j1.result_data["written"] is not a_writes  # B found A's bytes in place, or wrote them
    assert reconcile(run.coordinator).exit_code == 0


def test_a_worker_paused_inside_its_commit_keeps_the_job_nobody_runs_it_twice(run: Run) -> None:
    """Stopped after its fenced updates, before COMMIT, A holds SQLite's write lock (or, on
    PostgreSQL, J1's row lock, which B's sweep waits for): no other worker can take J1, however
    stale its lock; woken, A's commit lands and J1 ran exactly once. (Jobs that commit claimed
    for A, J0 or J2, carry a claim time from before the pause and may be reclaimed at once: their
    fences then hold as above.)"""
    _paused_then_woken(run, "in_commit")
    assert run.a is not None and run.b is not None
    a, b = run.a, run.b
    writes = run.writes()
    assert [version for _, version in writes] == [1, 2] and writes[0][0] == a.pid
    assert (run.root / TARGET).read_bytes() == render(V2)
    assert [e["event"] for e in a.events("completed", run.j1)] == ["completed"]
    assert b.events(job_id=run.j1) == [], "B touched J1"
    j1 = run.coordinator.get(run.j1)
    assert j1.status is JobStatus.COMPLETED and j1.attempts == 1 and j1.result_data["written"] is True
    assert reconcile(run.coordinator).exit_code == 0


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_worker_whose_clock_stopped_with_it_still_writes_nothing_stale(run: Run) -> None:
    """A pause its own clocks do not see: A stops right after claiming J1 (well inside the half
    lock timeout during which a worker on a one-machine ledger trusts its claim without asking),
    and its elapsed-time counter leaves the pause out, as a paused VM's does, while B, on another
    machine, goes on (B's shorter lock timeout stands for a pause longer than A's). B takes J1
    and runs J1 and J2; woken, A must not write v1 over v2. On PostgreSQL workers may be on other
    machines, so A asks the ledger before its write. (SQLite's workers share one machine: a pause
    its counters miss stops them all, and this cannot happen.)"""
    run.j1 = run.coordinator.enqueue(V1, max_attempts=5).id
    run.j0 = run.coordinator.enqueue(OTHER, max_attempts=5).id
    run.j2 = run.coordinator.enqueue(V2, max_attempts=5).id
    marker = run.tmp / "stopped"
    stop = {"TETHER_TEST_STOP_AT": "handler", "TETHER_TEST_STOP_MARKER": str(marker), "TETHER_TEST_STOP_PATH": TARGET}
    run.a = a = run.worker("a", {**stop, "TETHER_TEST_CLOCK_STOPS": "1"}, ("--lock-timeout", "8"))
    wait_for(lambda: marker.exists() and a.stopped(), "worker A to stop itself in J1's handler")
    run.b = b = run.worker("b")
    wait_for(lambda: run.status(run.j2) is JobStatus.COMPLETED, "B to run J1 and J2")
    a.popen.send_signal(signal.SIGCONT)
    wait_for(lambda: a.events("lost_lease", run.j1), "A to learn it lost J1")
    for w in (a, b):
        w.popen.send_signal(signal.SIGTERM)
    for w in (a, b):
        assert w.wait() == 0, w.text()[-3000:]
    assert [version for _, version in run.writes()] == [1, 2]
    assert (run.root / TARGET).read_bytes() == render(V2)
