"""Many worker processes on one PostgreSQL database: every job runs, once; and with workers
SIGKILLed at random and restarted, every job still completes and only reclaimed jobs run twice.

The issue asks for 8 workers x 5,000 jobs. That size is run by hand (it needs minutes on the
2-core machine, more than `make test` can spend):

    TETHER_SCALE_JOBS_PER_WORKER=5000 .venv/bin/pytest -q -s tests/test_postgres_scale.py

`make test` runs the same tests with 8 workers x 150 jobs each.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from conftest import scratch_pg_database
from tether import Coordinator
from tether.jobtypes import default_registry

REPO = Path(__file__).resolve().parent.parent
TETHER = Path(sys.executable).with_name("tether")
WORKERS = 8
JOBS_PER_WORKER = int(os.environ.get("TETHER_SCALE_JOBS_PER_WORKER", "150"))
BATCH = 1000


import pg_jobtypes  # noqa: E402  (tests/ is on sys.path, as for jobkit)

pytestmark = pytest.mark.slow


@pytest.fixture
def fresh_db() -> Iterator[str]:
    """A database of its own for one scale run, dropped afterwards."""
    with scratch_pg_database("tether_scale") as url:
        yield url


@pytest.fixture
def scale(fresh_db: str, tmp_path: Path) -> Iterator[Scale]:
    s = Scale(fresh_db, tmp_path)
    yield s
    s.close()


class Scale:
    """The ledger, the effect log, and the worker processes of one run."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.root = tmp / "data"
        self.root.mkdir()
        self.log = tmp / "effects.log"
        registry = default_registry()
        pg_jobtypes.register(registry)
        self.coordinator = Coordinator.open(url, root=self.root, registry=registry)
        self.procs: list[subprocess.Popen] = []

    def enqueue(self, count: int, **payload: Any) -> set[str]:
        ids: set[str] = set()
        t0 = time.monotonic()
        for start in range(0, count, BATCH):
            n = min(BATCH, count - start)
            payloads = [pg_jobtypes.PgAppend(log=str(self.log), **payload) for _ in range(n)]
            ids.update(r.id for r in self.coordinator.enqueue_many(payloads, max_attempts=20))
        print(f"enqueued {count} jobs in {time.monotonic() - t0:.1f}s")
        assert len(ids) == count
        return ids

    def start_worker(self, *args: str) -> subprocess.Popen:
        cmd = [
            str(TETHER),
            "--db",
            self.url,
            "--root",
            str(self.root),
            "--import",
            "tests.pg_jobtypes",
            "worker",
            "--quiet",
            *args,
        ]
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.procs.append(proc)
        return proc

    def status_counts(self) -> Counter[str]:
        with self.coordinator.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT status, count(*) FROM tether_jobs GROUP BY status")).all()
        return Counter({status: n for status, n in rows})

    def attempts(self) -> dict[str, int]:
        with self.coordinator.engine.connect() as conn:
            return dict(conn.execute(sa.text("SELECT id, attempts FROM tether_jobs")).all())

    def quarantines(self) -> dict[str, str | None]:
        """Why each job is quarantined: set when a worker died holding it (tether/ledger/reclaim.py)."""
        with self.coordinator.engine.connect() as conn:
            return dict(conn.execute(sa.text("SELECT id, quarantine FROM tether_jobs")).all())

    def effects(self) -> tuple[Counter[str], set[str]]:
        """How often each job's effect was applied, and by which processes."""
        counts: Counter[str] = Counter()
        pids: set[str] = set()
        if not self.log.exists():
            return counts, pids
        for line in self.log.read_text().splitlines():
            job_id, pid = line.split()
            counts[job_id] += 1
            pids.add(pid)
        return counts, pids

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.coordinator.close()


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def test_eight_worker_processes_complete_every_job_exactly_once(scale: Scale) -> None:
    total = WORKERS * JOBS_PER_WORKER
    # 5 ms a job (under the worker's slow_job, so batches stay whole): one process alone would
    # need seconds, longer than the others take to start, so they all share the work. No-op jobs
    # in batches of 100 let the first process up drain all 1,200 on a loaded machine.
    ids = scale.enqueue(total, hold=0.005)
    t0 = time.monotonic()
    procs = [scale.start_worker("--until-idle") for _ in range(WORKERS)]
    for p in procs:
        _, stderr = p.communicate(timeout=30 + total / 20)
        assert p.returncode == 0, stderr.decode()[-2000:]
    elapsed = time.monotonic() - t0

    assert scale.status_counts() == {"completed": total}
    counts, pids = scale.effects()
    assert set(counts) == ids, "an effect is missing or belongs to no job"
    assert [job for job, n in counts.items() if n != 1] == []
    assert set(scale.attempts().values()) == {1}
    assert len(pids) > 1, "one process ran every job: the workers did not run concurrently"
    print(
        f"{WORKERS} workers drained {total} jobs in {elapsed:.1f}s ({total / elapsed:.0f} jobs/s, "
        f"{len(pids)} processes ran jobs)"
    )


def test_workers_sigkilled_at_random_and_restarted_lose_no_job(scale: Scale) -> None:
    total = WORKERS * JOBS_PER_WORKER
    lock_timeout = 3.0
    # hold: time between the effect and the completion, so kills land mid-job too.
    ids = scale.enqueue(total, hold=0.02)
    args = ("--lock-timeout", str(lock_timeout), "--poll-interval", "0.2")
    live = [scale.start_worker(*args) for _ in range(WORKERS)]
    rng = random.Random(6)
    # Kill points by progress, not by time, so the test kills as often on a fast machine as on
    # a loaded one: one SIGKILL each time another 5% of the jobs completed, up to 80%.
    kill_at = [total * k // 20 for k in range(1, 17)]
    kills = 0
    t0 = time.monotonic()
    deadline = t0 + 120 + total / 5
    while (done := scale.status_counts().get("completed", 0)) < total:
        assert time.monotonic() < deadline, f"not drained: {scale.status_counts()}"
        time.sleep(rng.uniform(0.05, 0.2))
        # Kill only workers that have run a job: killing one still importing proves nothing.
        _, working = scale.effects()
        eligible = [p for p in live if str(p.pid) in working]
        if kill_at and done >= kill_at[0] and eligible:
            kill_at = [k for k in kill_at if k > done]
            victim = rng.choice(eligible)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            assert victim.returncode == -signal.SIGKILL
            kills += 1
            live.remove(victim)
            live.append(scale.start_worker(*args))
    elapsed = time.monotonic() - t0
    for p in live:
        p.terminate()
    for p in live:
        _, stderr = p.communicate(timeout=30)
        # -SIGTERM: a just-restarted worker still importing, before its handlers are installed.
        assert p.returncode in (0, -signal.SIGTERM), stderr.decode()[-2000:]

    assert kills >= 3
    assert scale.status_counts() == {"completed": total}
    counts, _ = scale.effects()
    attempts = scale.attempts()
    assert set(counts) == ids, "a completed job never applied its effect, or an unknown id was logged"
    quarantine = scale.quarantines()
    twice = {job: n for job, n in counts.items() if n > 1}
    # A job runs again only after a dead worker held it (it is quarantined), at most once per
    # counted attempt and once more for the crashed batch whose attempt it got back (a job is in
    # at most one: quarantined, it is claimed alone).
    assert {job: n for job, n in twice.items() if not (quarantine[job] and n <= attempts[job] + 1)} == {}
    reclaimed = sum(1 for q in quarantine.values() if q)
    assert reclaimed >= 1, "no kill hit a running job: the reclaim path was not exercised"
    print(
        f"{kills} SIGKILLs over {elapsed:.1f}s: {total} jobs completed, {reclaimed} reclaimed "
        f"(quarantined), {len(twice)} applied twice"
    )
