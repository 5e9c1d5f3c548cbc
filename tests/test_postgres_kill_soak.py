"""Random SIGKILLs of three worker processes on one PostgreSQL ledger while jobs keep arriving:
overwrite chains on a few dozen paths, deletes among them, and keyed jobs enqueued twice (as a
caller that retries would). Afterwards nothing is lost (every job completed, none failed), nothing
is torn (every file holds the whole of some job's bytes, no temp file is left), the effects on each
path happened in enqueue order, and the reconciler finds the root in sync with the ledger.

A soak, run by hand (``make test`` leaves it out: even 3 kills cost about 10 s here, and
tests/test_postgres_scale.py already SIGKILLs workers at random on every run):

    TETHER_PG_KILL_SOAK=1000 .venv/bin/pytest -q -s tests/test_postgres_kill_soak.py

Figures of the 1,000-kill run are in benchmarks/README.md.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa

from conftest import scratch_pg_database
from tether import Coordinator, InsertResult
from tether.errors import DatabaseUnavailable
from tether.jobtypes import CreateFile, DeleteFile, default_registry, render
from tether.jobtypes.datafiles.paths import TEMP_SUFFIX
from tether.reconcile.check import reconcile
from workerkit import ForkedWorker, Zygote

pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("TETHER_PG_KILL_SOAK", "0"))
WORKERS = 3
LOCK_TIMEOUT = 2.0
PATHS = [f"d{d}/f{f:02d}.json" for d in range(4) for f in range(10)]
BACKLOG = 150  # jobs kept waiting while the kills go on
MAX_ATTEMPTS = 100  # a job charged with every crash it was running alone for must not run out


@dataclass
class Ledger:
    """What the test enqueued: per path, the sequence number of each job and its bytes' hash."""

    coordinator: Coordinator
    seq: Counter[str] = field(default_factory=Counter)
    writes: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> sha256 -> seq
    deletes: dict[str, list[int]] = field(default_factory=dict)  # path -> seqs of its deletes
    ids: set[str] = field(default_factory=set)
    duplicates: int = 0
    deadlocks: int = 0  # batch enqueues refused by a deadlock with a group commit, retried

    def round(self, rng: random.Random, n: int) -> None:
        """About ``n`` jobs on random paths: plain ones in one batch, keyed ones one by one, twice."""
        batch: list[CreateFile | DeleteFile] = []
        for _ in range(n):
            path = rng.choice(PATHS)
            self.seq[path] += 1
            seq = self.seq[path]
            if rng.random() < 0.15:
                self.deletes.setdefault(path, []).append(seq)
                batch.append(DeleteFile(path=path))
                continue
            payload = CreateFile(path=path, content={"path": path, "seq": seq, "pad": "x" * rng.randrange(4000)})
            payload = payload.model_copy(update={"overwrite": True})
            self.writes.setdefault(path, {})[hashlib.sha256(render(payload)).hexdigest()] = seq
            if rng.random() < 0.2:
                # Plain jobs enqueued before it first: a batch keeps its enqueue order per path.
                self._plain(batch)
                batch = []
                for _ in range(2):
                    [r] = self._enqueue(partial(self._keyed, payload, f"{path}#{seq}"))
                    self.duplicates += r.duplicate
            else:
                batch.append(payload)
        self._plain(batch)

    def _keyed(self, payload: CreateFile, key: str) -> list[InsertResult]:
        return [self.coordinator.enqueue(payload, key=key, max_attempts=MAX_ATTEMPTS)]

    def _plain(self, batch: list[CreateFile | DeleteFile]) -> None:
        if batch:
            self._enqueue(partial(self.coordinator.enqueue_many, batch, max_attempts=MAX_ATTEMPTS))

    def _enqueue(self, enqueue: Callable[[], list[InsertResult]]) -> list[InsertResult]:
        """``enqueue()``, again when it was refused for a deadlock with a worker's group commit:
        that stored nothing (issue 33, item 6, where tether is to retry it itself)."""
        while True:
            try:
                results = enqueue()
            except DatabaseUnavailable as e:
                if "deadlock detected" not in str(e):
                    raise
                self.deadlocks += 1
                continue
            self.ids.update(r.id for r in results)
            return results

    def counts(self) -> Counter[str]:
        with self.coordinator.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT status, count(*) FROM tether_jobs GROUP BY status")).all()
        return Counter(dict(rows))


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with scratch_pg_database("tether_kills") as url:
        root = tmp_path / "data"
        root.mkdir()
        with Coordinator.open(url, root=root, registry=default_registry()) as c:
            yield Ledger(c)


class Effects:
    """The effect log (tests/proc_pause.py), read as it grows: which processes have acted."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.pids = path, 0, set[int]()

    def seen(self) -> set[int]:
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offset += len(complete)
            self.pids.update(int(line.split(b" ", 1)[0]) for line in complete.splitlines())
        return self.pids


class Soak:
    """The workers of one soak: started, killed at random and replaced, stopped."""

    def __init__(self, ledger: Ledger, tmp: Path) -> None:
        self.ledger, self.tmp = ledger, tmp
        self.log = tmp / "effects.log"
        self.zygote = Zygote({"TETHER_TEST_EFFECT_LOG": str(self.log)})
        self.effects = Effects(self.log)
        self.rng = random.Random(33)
        self.started, self.kills = 0, 0
        self.torn_reads: list[str] = []
        self.live = [self.worker() for _ in range(WORKERS)]

    def worker(self) -> ForkedWorker:
        self.started += 1
        c = self.ledger.coordinator
        return self.zygote.start(
            c.engine.url.render_as_string(False),
            c.root,
            self.tmp / f"w{self.started}.out",
            *("--lock-timeout", str(LOCK_TIMEOUT), "--poll-interval", "0.05"),
            quiet=True,
        )

    def close(self) -> None:
        for w in self.live:
            w.kill()
        self.zygote.close()

    def kill_at_random(self, kills: int) -> None:
        """SIGKILL a random worker that has acted since it started (killing one still importing
        proves nothing) and start another, ``kills`` times, keeping a backlog of jobs waiting
        and reading a few files each time (a reader never sees a torn file)."""
        rng, ledger = self.rng, self.ledger
        t0 = time.monotonic()
        while self.kills < kills:
            assert time.monotonic() - t0 < 120 + 3 * kills, f"only {self.kills} kills; {ledger.counts()}"
            time.sleep(rng.uniform(0.02, 0.3))  # pacing the kills, not waiting for a condition
            if sum(n for status, n in ledger.counts().items() if status in ("pending", "claimed")) < BACKLOG:
                ledger.round(rng, BACKLOG // 3)
            self.torn_reads += _torn(ledger, rng.sample(PATHS, 3))
            eligible = [w for w in self.live if w.pid in self.effects.seen()]
            if eligible:
                victim = rng.choice(eligible)
                victim.send_signal(signal.SIGKILL)
                assert victim.wait() == -signal.SIGKILL
                self.kills += 1
                self.live[self.live.index(victim)] = self.worker()

    def drain_and_stop(self) -> None:
        """Wait until no job is pending or claimed (the dead workers' jobs are reclaimed once
        their locks are stale), then stop the workers; none may have printed a traceback."""
        deadline = time.monotonic() + 120
        while (counts := self.ledger.counts())["pending"] + counts["claimed"]:
            assert time.monotonic() < deadline, f"not drained: {counts}"
            time.sleep(0.1)
        for w in self.live:
            w.send_signal(signal.SIGTERM)
        for w in self.live:
            assert w.wait() in (0, -signal.SIGTERM)  # -SIGTERM: a worker still opening the ledger
        outputs = "".join(p.read_text(errors="replace") for p in self.tmp.glob("w*.out"))
        assert "Traceback" not in outputs, outputs[-3000:]


@pytest.mark.skipif(not KILLS, reason="a soak: TETHER_PG_KILL_SOAK=<kills> (1000 for the reported run)")
def test_workers_sigkilled_at_random_lose_nothing_tear_nothing_and_keep_each_paths_order(
    ledger: Ledger, tmp_path: Path
) -> None:
    c = ledger.coordinator
    t0 = time.monotonic()
    ledger.round(random.Random(0), BACKLOG)
    soak = Soak(ledger, tmp_path)
    try:
        soak.kill_at_random(KILLS)
        soak.drain_and_stop()
    finally:
        soak.close()
    elapsed = time.monotonic() - t0

    # Nothing lost: every job the enqueues returned is in the ledger, completed; none failed.
    assert ledger.counts() == {"completed": len(ledger.ids)}
    with c.engine.connect() as conn:
        reclaimed, retried = conn.execute(
            sa.text(
                "SELECT count(*) FILTER (WHERE quarantine IS NOT NULL),"
                " count(*) FILTER (WHERE attempts > 1) FROM tether_jobs"
            )
        ).one()
    # Nothing torn, order kept: every rename put the whole of one of that path's jobs' bytes in
    # place, and the effects on each path follow its enqueue order.
    findings = _order_findings(soak.log, c.root, ledger)
    assert findings == [] and soak.torn_reads == [], (findings[:10], soak.torn_reads[:10])
    assert list(c.root.rglob(f"*{TEMP_SUFFIX}")) == []
    report = reconcile(c)
    assert report.exit_code == 0 and report.findings == [], report.findings[:10]
    print(
        f"\n{soak.kills} SIGKILLs of {WORKERS} workers ({soak.started} started) in {elapsed:.0f}s: "
        f"{len(ledger.ids)} jobs ({sum(ledger.seq.values())} payloads, {ledger.duplicates} keyed re-enqueues "
        f"returned the active job; {ledger.deadlocks} enqueues refused by a deadlock and retried), "
        f"all completed, none failed; {reclaimed} reclaimed from dead workers, "
        f"{retried} with attempts > 1; {len(soak.log.read_text().splitlines())} effects logged, none out of "
        f"order or torn ({len(soak.torn_reads)} torn reads); reconcile in sync "
        f"({report.counts.get('in_sync', 0)} paths)"
    )


def _torn(ledger: Ledger, paths: list[str]) -> list[str]:
    """Paths of ``paths`` whose file, read now, is not the whole of one of their jobs' bytes."""
    torn = []
    for path in paths:
        try:
            data = (ledger.coordinator.root / path).read_bytes()
        except FileNotFoundError:
            continue
        if hashlib.sha256(data).hexdigest() not in ledger.writes.get(path, {}):
            torn.append(path)
    return torn


def _order_findings(log: Path, root: Path, ledger: Ledger) -> list[str]:
    """Each effect on a path must come from a job no older than the one before it (a delete is
    matched to the earliest of the path's deletes that keeps that true)."""
    prefix = f"{root.resolve()}/"
    last: dict[str, int] = {}
    findings = []
    for line in log.read_text().splitlines():
        pid, kind, where, *digest = line.split(" ")
        path = where.removeprefix(prefix)
        at = last.get(path, 0)
        if kind == "write":
            seq = ledger.writes.get(path, {}).get(digest[0])
            if seq is None:
                findings.append(f"{path}: pid {pid} wrote bytes no job of it has (torn?)")
                continue
        else:
            deletes = ledger.deletes.get(path, [])
            i = bisect.bisect_left(deletes, at)
            if i == len(deletes):
                findings.append(f"{path}: pid {pid} deleted it after job {at} wrote, and no later delete exists")
                continue
            seq = deletes[i]
        if seq < at:
            findings.append(f"{path}: pid {pid} applied job {seq} after job {at}")
        last[path] = max(at, seq)
    return findings
