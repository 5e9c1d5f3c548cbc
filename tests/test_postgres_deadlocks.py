"""Deadlocks on PostgreSQL: batch enqueues beside draining workers never meet one; a conflict that
ends one of tether's own transactions is run again inside tether; one that ends an application's
own transaction (``session=``) reaches it as TransactionConflict.

The drain runs ENQUEUE_SECONDS of batch enqueues in ``make test``; ``TETHER_SOAK=1`` runs it for
30 s (the issue's length):

    TETHER_SOAK=1 .venv/bin/pytest -q -s tests/test_postgres_deadlocks.py -k drain
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg.errors
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from conftest import drop_ledger, scratch_pg_database
from jobkit import completed
from tether import Coordinator, CreateFile, TetherError, TransactionConflict
from tether.jobtypes import render
from tether.ledger import conflict
from tether.ledger.backend import _Cursor
from workerkit import wait_for

REPO = Path(__file__).resolve().parent.parent
TETHER = Path(sys.executable).with_name("tether")
ENQUEUE_SECONDS = 30.0 if os.environ.get("TETHER_SOAK") else 8.0
PATHS = 30
BATCH = 40
BACKLOG = 20  # the next batch once at most this many jobs are active: workers keep up, targets stay hot
DEADLINE = 60.0


@pytest.fixture
def fresh_db() -> Iterator[str]:
    """A database of its own, so its deadlock count is this test's alone."""
    with scratch_pg_database("tether_deadlock") as url:
        yield url


def deadlocks(url: str) -> int:
    """The server's count of deadlocks detected in ``url``'s database (each backend reports its
    own when its transaction ends or it exits)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            query = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            return int(conn.exec_driver_sql(query).scalar_one())
    finally:
        engine.dispose()


def active(c: Coordinator) -> int:
    with c.engine.connect() as conn:
        return int(
            conn.exec_driver_sql("SELECT count(*) FROM tether_jobs WHERE status IN ('pending', 'claimed')").scalar_one()
        )


@pytest.mark.slow
def test_postgres_batch_enqueues_beside_two_draining_workers_are_never_refused_and_never_deadlock(
    fresh_db: str, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    c = Coordinator.open(fresh_db, root=root)
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    procs = []
    for log in logs:
        with open(log, "wb") as out:
            argv = [str(TETHER), "--db", fresh_db, "--root", str(root), "worker", "--threads", "2"]
            procs.append(subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT))
    try:
        before = deadlocks(fresh_db)
        rng = random.Random(33)
        batches, refused = 0, []
        started = time.monotonic()
        while time.monotonic() - started < ENQUEUE_SECONDS:
            # Shared paths in a new order each batch: its rows share-lock jobs target after target.
            paths = [f"p{rng.randrange(PATHS)}.json" for _ in range(BATCH)]
            try:
                c.enqueue_many(
                    [
                        CreateFile(path=p, content={"batch": batches, "n": n}, overwrite=True)
                        for n, p in enumerate(paths)
                    ]
                )
                batches += 1
            except TetherError as e:
                refused.append(f"{type(e).__name__}: {e}")
            wait_for(lambda: active(c) <= BACKLOG, "the workers to catch up")
        wait_for(lambda: active(c) == 0, "the drain")
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(DEADLINE) == 0
        after = deadlocks(fresh_db)
        with c.engine.connect() as conn:
            counts: dict[str, int] = dict(
                conn.exec_driver_sql("SELECT status, count(*) FROM tether_jobs GROUP BY status").all()
            )
            latest = conn.exec_driver_sql(
                "SELECT DISTINCT ON (ordering_key) ordering_key, payload FROM tether_jobs"
                " ORDER BY ordering_key, id DESC"
            ).all()
        print(
            f"\n{ENQUEUE_SECONDS:g}s: {batches} batches of {BATCH} recorded, {len(refused)} refused, "
            f"deadlocks {before} -> {after}, {counts}"
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        c.close()
    assert refused == [], refused[:3]
    assert after == before, f"{after - before} deadlock(s) while enqueues met draining workers"
    assert counts == {"completed": batches * BATCH}
    # Each path ends holding what its last job wrote: the jobs of a target ran in enqueue order.
    for target, payload in latest:
        assert (root / target.removeprefix("file:")).read_bytes() == render(CreateFile.model_validate_json(payload)), (
            target
        )
    for log in logs:
        text = log.read_text()
        assert "Traceback" not in text and '"db_error"' not in text and '"db_conflict"' not in text, text[-2000:]


# -- conflicts inside tether's own transactions: run again -------------------------------------


@pytest.fixture
def pg(pg_database: str, tmp_path: Path) -> Iterator[Coordinator]:
    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        drop_ledger(conn)
    engine.dispose()
    with Coordinator.open(pg_database, root=tmp_path / "data") as c:
        yield c


class Conflicts:
    """Makes the driver raise a deadlock (SQLSTATE 40P01) on the next ``times`` statements that
    contain ``marker``, as PostgreSQL does to the transaction it picks to end."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.marker = ""
        self.times = 0
        self.raised = 0
        for name in ("execute", "send", "later", "executemany", "records", "rows", "scalar", "insert_returning"):
            original = getattr(_Cursor, name)
            monkeypatch.setattr(_Cursor, name, self._wrap(original))

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def method(cur: _Cursor, statement: str, *args: Any) -> Any:
            if self.times and self.marker in statement:
                self.times -= 1
                self.raised += 1
                raise psycopg.errors.DeadlockDetected("deadlock detected")
            return original(cur, statement, *args)

        return method

    def arm(self, marker: str, times: int = 1) -> None:
        self.marker, self.times = marker, times


@pytest.fixture
def conflicts(monkeypatch: pytest.MonkeyPatch) -> Conflicts:
    return Conflicts(monkeypatch)


def conflict_events(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    events = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tether.events"]
    return [e for e in events if e["event"] == "db_conflict"]


def statuses(c: Coordinator) -> dict[str, str]:
    with c.engine.connect() as conn:
        return dict(conn.exec_driver_sql("SELECT id, status FROM tether_jobs").all())


def test_postgres_a_batch_enqueue_that_meets_a_deadlock_is_run_again_and_recorded_once(
    pg: Coordinator, conflicts: Conflicts, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tether.events")
    conflicts.arm("json_array_elements")  # the batch insert of jobs with a target
    results = pg.enqueue_many([CreateFile(path=f"{n % 3}.json", content=n, overwrite=True) for n in range(5)])
    assert conflicts.raised == 1
    assert statuses(pg) == {r.id: "pending" for r in results}
    [event] = conflict_events(caplog)
    assert (event["sqlstate"], event["attempt"]) == ("40P01", 1)


def test_postgres_a_transaction_block_that_meets_a_deadlock_is_run_again(pg: Coordinator, conflicts: Conflicts) -> None:
    # The block gathers jobs; the one transaction that records them is tether's own.
    conflicts.arm("INSERT INTO")
    with pg.transaction() as tx:
        tx.enqueue(CreateFile(path="a.json", content=1))
        tx.enqueue(CreateFile(path="b.json", content=2), key="b")
    assert conflicts.raised == 1
    assert sorted(statuses(pg).values()) == ["pending", "pending"]


def test_postgres_a_group_commit_that_meets_a_deadlock_midway_is_run_again_whole(
    pg: Coordinator, conflicts: Conflicts
) -> None:
    first = [r.id for r in pg.enqueue_many([CreateFile(path=f"{n}.json", content=n) for n in range(2)])]
    second = [r.id for r in pg.enqueue_many([CreateFile(path=f"{n}.json", content=-n) for n in range(2)])]
    claimed = pg.queue.claim("w", limit=10)
    assert sorted(j.id for j in claimed) == first
    # Ended after its completions ran: they are undone with it, and run again.
    conflicts.arm("SET blocked = FALSE")
    moved, following = pg.queue.finish_and_claim("w", [completed(j, None) for j in claimed], records=False, claim=10)
    assert conflicts.raised == 1
    assert moved == [True, True]
    assert sorted(j.id for j in following) == second
    assert statuses(pg) == {**dict.fromkeys(first, "completed"), **dict.fromkeys(second, "claimed")}


@pytest.mark.parametrize(
    ("operation", "marker"),
    [("claim", "FOR UPDATE OF j SKIP LOCKED"), ("heartbeat", "SET locked_at"), ("sweep", "locked_at < ")],
)
def test_postgres_a_claim_heartbeat_or_sweep_that_meets_a_deadlock_is_run_again(
    pg: Coordinator, conflicts: Conflicts, operation: str, marker: str
) -> None:
    job_id = pg.enqueue(CreateFile(path="a.json", content=1)).id
    if operation == "claim":
        conflicts.arm(marker)
        assert [j.id for j in pg.queue.claim("w")] == [job_id]
    else:
        [job] = pg.queue.claim("w")
        conflicts.arm(marker)  # after the claim, so only the operation under test can meet it
        if operation == "heartbeat":
            assert pg.queue.heartbeat("w", [job]) == []
        else:
            assert [j.id for j in pg.queue.reclaim_stale(-1)] == [job_id]
    assert conflicts.raised == 1


def test_postgres_an_enqueue_that_meets_a_deadlock_every_time_raises_transaction_conflict(
    pg: Coordinator, conflicts: Conflicts
) -> None:
    conflicts.arm("json_array_elements", times=conflict.ATTEMPTS)
    with pytest.raises(TransactionConflict) as info:
        pg.enqueue_many([CreateFile(path=f"{n}.json", content=n) for n in range(3)])
    assert conflicts.raised == conflict.ATTEMPTS
    message = str(info.value)
    assert "deadlock detected" in message and "40P01" in message
    assert "nothing was enqueued: enqueue them again" in message
    assert statuses(pg) == {}


# -- a conflict inside an application's own transaction: the application's to run again --------


def _waiting_for_a_lock(c: Coordinator) -> bool:
    query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    with c.engine.connect() as conn:
        return bool(conn.exec_driver_sql(query).scalar_one())


def test_postgres_a_deadlock_inside_an_applications_session_raises_transaction_conflict(pg: Coordinator) -> None:
    """Two sessions enqueue keyed jobs crosswise: each waits for the other's uncommitted key, a
    real deadlock. The one PostgreSQL ends gets TransactionConflict; run again, it succeeds."""
    ours, theirs = Session(pg.engine), Session(pg.engine)
    try:
        # Ours checks for the deadlock first (deadlock_timeout), so it is the one ended.
        ours.execute(sa.text("SET LOCAL deadlock_timeout = '20ms'"))
        pg.enqueue(CreateFile(path="a.json", content=1), key="a", session=ours)
        pg.enqueue(CreateFile(path="b.json", content=2), key="b", session=theirs)
        waiting: list[Any] = []
        other = threading.Thread(
            target=lambda: waiting.append(pg.enqueue(CreateFile(path="a.json", content=3), key="a", session=theirs))
        )
        other.start()
        wait_for(lambda: _waiting_for_a_lock(pg), "the other session to wait for our key", 10)
        with pytest.raises(TransactionConflict) as info:
            pg.enqueue(CreateFile(path="b.json", content=4), key="b", session=ours)
        ours.rollback()
        other.join(10)
        theirs.commit()
    finally:
        ours.close()
        theirs.close()
    message = str(info.value)
    assert "deadlock detected" in message and "40P01" in message
    assert "roll the session back and run the whole transaction again" in message
    assert conflict.sqlstate(info.value.__cause__) == "40P01"  # type: ignore[arg-type]
    # Nothing of ours was recorded; theirs went through once ours was rolled back.
    assert sorted(statuses(pg).values()) == ["pending", "pending"] and not waiting[0].duplicate
    with Session(pg.engine) as again:
        assert pg.enqueue(CreateFile(path="a.json", content=1), key="a", session=again).duplicate
        again.commit()


def test_postgres_tethers_own_enqueue_ended_by_a_real_deadlock_is_run_again(
    pg: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    """tether's enqueue of keys a, b meets an application's session holding b and then asking for
    a: PostgreSQL ends tether's transaction (the session checks for deadlocks only after 10 s),
    tether runs it again once the session commits, and finds both jobs there."""
    caplog.set_level(logging.INFO, logger="tether.events")
    app = Session(pg.engine)
    try:
        app.execute(sa.text("SET LOCAL deadlock_timeout = '10s'"))
        mine = pg.enqueue(CreateFile(path="b.json", content=2), key="b", session=app)
        results: list[Any] = []

        def enqueue_a_then_b() -> None:
            with pg.transaction() as tx:
                tx.enqueue(CreateFile(path="a.json", content=1), key="a")
                tx.enqueue(CreateFile(path="b.json", content=3), key="b")
            results.extend(tx.results)

        enqueue = threading.Thread(target=enqueue_a_then_b)
        enqueue.start()
        wait_for(lambda: _waiting_for_a_lock(pg), "tether's enqueue to wait for key b", 10)
        theirs = pg.enqueue(CreateFile(path="a.json", content=4), key="a", session=app)
        app.commit()
        enqueue.join(10)
    finally:
        app.close()
    assert not enqueue.is_alive()
    assert [(r.id, r.duplicate) for r in results] == [(theirs.id, True), (mine.id, True)]
    # At least one deadlock, each run again: a run again that takes key a before the session's
    # insert of it (woken by the first deadlock) has woken forms the same cycle once more, and
    # tether's transaction, whose deadlock check comes first, is the one ended again.
    sqlstates = [e["sqlstate"] for e in conflict_events(caplog)]
    assert sqlstates and set(sqlstates) == {"40P01"}, sqlstates
