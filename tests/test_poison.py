"""A job that kills its worker takes no batch-mate down with it (issue 22), with real processes.

The operator's reproduction: 61 jobs of one type enqueued with ``--max-attempts``, where the
poison job calls ``os._exit(1)`` (as a segfaulting C extension or the OOM killer ends a process),
then ``tether worker --until-idle --lock-timeout 0.5`` again and again (the issue used 1 s), each
round as soon as the dead worker's locks are stale. Before the fix every job of the poisoned
batch failed. Now the poison job fails after exactly ``max_attempts`` crashes (counted by its own
run log), and every other job completes on its first counted attempt. On PostgreSQL two workers
start each round, claiming with SKIP LOCKED side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import BACKENDS
from tether import Coordinator
from tether.jobtypes import default_registry
from workerkit import REPO, TETHER, pj

pytestmark = pytest.mark.slow


TOTAL = 61
# The issue ran with 1 s; every round waits that long for the dead worker's locks to go stale.
LOCK_TIMEOUT = 0.5
DEADLINE = 60.0  # for one worker round; generous on a busy machine


@dataclass
class Drained:
    """What the rounds of workers left: each job's row, each job's runs, every worker's events."""

    ids: list[str]  # in enqueue order
    poison: set[str]
    rows: dict[str, dict]
    runs: Counter[str]
    events: list[dict]
    crashes: int  # worker processes that exited 1
    status_lines: list[str] = field(default_factory=list)  # `tether status` the first time jobs were quarantined


def open_coordinator(db_url: str, root: Path) -> Coordinator:
    registry = default_registry()
    pj.register(registry)
    return Coordinator.open(db_url, root=root, registry=registry)


def start_worker(db_url: str, root: Path, stderr: Path, lock_timeout: float) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    argv = [*TETHER, "--db", db_url, "--root", str(root), "--import", "tests.proc_jobtypes"]
    argv += ["worker", "--until-idle", "--lock-timeout", str(lock_timeout)]
    with open(stderr, "wb") as err:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=err, stderr=subprocess.STDOUT)  # events: stdout


def tether(db_url: str, root: Path, *args: str) -> str:
    """Run a ``tether`` command on the ledger; its standard output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["COLUMNS"] = "200"  # one table row per line
    done = subprocess.run(
        [*TETHER, "--db", db_url, "--root", str(root), *args], env=env, capture_output=True, text=True, timeout=DEADLINE
    )
    return done.stdout


def rows_of(c: Coordinator) -> dict[str, dict]:
    with c.engine.connect() as conn:
        result = conn.execute(
            sa.text("SELECT id, status, attempts, locked_at, last_error, quarantine FROM tether_jobs")
        ).mappings()
        return {r["id"]: dict(r) for r in result}


def locks_are_stale(c: Coordinator, lock_timeout: float) -> bool:
    """Every claimed job's lock is older than the lock timeout: the next round's sweep takes it."""
    cutoff = datetime.now(UTC) - timedelta(seconds=lock_timeout)
    claimed = [c.get(i) for i, r in rows_of(c).items() if r["status"] == "claimed"]
    return all(job.locked_at is not None and job.locked_at < cutoff for job in claimed)


def wait_for(condition, what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def drain_with_crashes(
    db_url: str,
    root: Path,
    tmp_path: Path,
    *,
    poison_at: set[int],
    max_attempts: int,
    workers: int = 1,
    lock_timeout: float = LOCK_TIMEOUT,
    check_status: bool = False,
) -> Drained:
    """Enqueue TOTAL jobs (1-based ``poison_at`` are poison), then run rounds of ``workers``
    worker processes until no job is outstanding."""
    log = tmp_path / "runs.log"
    with open_coordinator(db_url, root) as c:
        jobs = [pj.PoisonOrNot(log=str(log), n=n, poison=n in poison_at) for n in range(1, TOTAL + 1)]
        ids = [r.id for r in c.enqueue_many(jobs, max_attempts=max_attempts)]
        poison = {ids[n - 1] for n in poison_at}
        crashes = 0
        stderrs: list[Path] = []
        status_lines: list[str] = []
        # Each poison job can crash at most max_attempts + 1 rounds (the batch crash, then alone).
        for round_ in range(len(poison_at) * (max_attempts + 1) + 2):
            procs = []
            for k in range(workers):
                stderrs.append(tmp_path / f"round{round_}-worker{k}.stderr")
                procs.append(start_worker(db_url, root, stderrs[-1], lock_timeout))
            codes = []
            for p in procs:
                try:
                    codes.append(p.wait(timeout=DEADLINE))
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    pytest.fail(f"a worker of round {round_} did not exit within {DEADLINE}s")
            assert set(codes) <= {0, 1}, f"round {round_}: exit codes {codes}:\n{stderrs[-1].read_text()[-2000:]}"
            crashes += codes.count(1)
            rows = rows_of(c)
            if not [r for r in rows.values() if r["status"] in ("pending", "claimed")]:
                break
            assert 1 in codes, f"round {round_}: no worker crashed, yet jobs are outstanding"
            if check_status and not status_lines and c.stats().quarantined:
                status_lines = tether(db_url, root, "status").splitlines()
            wait_for(lambda: locks_are_stale(c, lock_timeout), "the dead worker's locks to go stale")
        else:
            pytest.fail(f"jobs still outstanding after {round_ + 1} rounds")
        rows = rows_of(c)
    runs = Counter(line.split()[0] for line in log.read_text().splitlines())
    events = [json.loads(line) for s in stderrs for line in s.read_text().splitlines() if line.startswith("{")]
    return Drained(ids, poison, rows, runs, events, crashes, status_lines)


def assert_only_the_poison_failed(d: Drained, max_attempts: int) -> None:
    innocent = [i for i in d.ids if i not in d.poison]
    assert {d.rows[i]["status"] for i in innocent} == {"completed"}
    # No innocent job ever failed, nor lost an attempt to the poison: one counted attempt each.
    failed = ("failed", "reclaimed_exhausted")  # by its handler, or by the sweep after its last crash
    assert {e["job_id"] for e in d.events if e["event"] in failed} == d.poison
    assert {i: d.rows[i]["attempts"] for i in innocent if d.rows[i]["attempts"] != 1} == {}
    for i in d.poison:
        row = d.rows[i]
        assert (row["status"], row["attempts"]) == ("failed", max_attempts)
        assert row["last_error"].startswith(
            f"worker died while running (reclaimed, attempt {max_attempts} of {max_attempts}; no attempts left)"
        ), row["last_error"]
    assert d.crashes == sum(d.runs[i] for i in d.poison)  # every crash was a poison job's run


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_a_poison_job_fails_alone_and_every_batch_mate_completes(
    db_url: str, root: Path, tmp_path: Path, max_attempts: int
) -> None:
    # PostgreSQL: two workers per round, claiming side by side with SKIP LOCKED.
    workers = 2 if db_url.startswith("postgresql") else 1
    d = drain_with_crashes(
        db_url,
        root,
        tmp_path,
        poison_at={21},
        max_attempts=max_attempts,
        workers=workers,
        check_status=max_attempts > 1,
    )
    assert_only_the_poison_failed(d, max_attempts)
    [poison] = d.poison
    assert d.runs[poison] == max_attempts  # exactly max_attempts crashes
    # With one attempt every job is claimed alone (its last attempt), so its one crash is pinned at once.
    failed = tether(db_url, root, "failed")
    assert f"worker died while running (reclaimed, attempt {max_attempts} of {max_attempts}" in failed, failed
    if max_attempts > 1:
        # What an operator sees: the quarantined jobs in `tether status`, the reason in `tether failed`.
        assert any("quarantined: a worker died while holding them" in line for line in d.status_lines), d.status_lines
        assert poison in failed
        # The sweep that reclaimed it after its second crash said so: its event, not the row at a
        # round's end, by which time the round's other worker may already have failed it.
        reclaims = [e["error"] for e in d.events if e["event"] == "reclaimed" and e["job_id"] == poison]
        assert any(
            r.startswith(f"worker died while running (reclaimed, attempt 2 of {max_attempts})") for r in reclaims
        )


# Where the poison sits does not depend on the backend: both backends see the two-poison batch
# (with two workers on PostgreSQL), SQLite alone the first and last places (the suite's time).
# The db_url fixture (conftest) makes each ledger, empty.
@pytest.mark.parametrize(
    ("db_url", "poison_at"),
    [
        pytest.param("sqlite", {1}, id="sqlite-first"),
        pytest.param("sqlite", {TOTAL}, id="sqlite-last"),
        pytest.param("sqlite", {21, 41}, id="sqlite-two"),
        *([pytest.param("postgres", {21, 41}, id="postgres-two")] if "postgres" in BACKENDS else []),
    ],
    indirect=["db_url"],
)
def test_a_poison_job_first_last_or_beside_another_in_one_batch_fails_after_exactly_max_attempts_crashes(
    db_url: str, root: Path, tmp_path: Path, poison_at: set[int]
) -> None:
    workers = 2 if db_url.startswith("postgresql") else 1
    d = drain_with_crashes(db_url, root, tmp_path, poison_at=poison_at, max_attempts=3, workers=workers)
    assert_only_the_poison_failed(d, 3)
    assert {i: d.runs[i] for i in d.poison} == {i: 3 for i in d.poison}
