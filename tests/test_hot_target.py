"""A hot target (issue 23): the jobs on one target run in enqueue order, the claim takes only
each target's oldest active job, and what it costs does not grow with how many wait behind it.
On SQLite and PostgreSQL (the ``db_url`` fixture), except where a test names one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from conftest import drop_ledger
from jobkit import Note, NoteType, completed, registry_with
from tether import Coordinator, FakeClock, JobStatus
from tether.ledger.catalogue import SQLITE
from tether.ledger.lifecycle import Decision
from workerkit import wait_for

WAITING = 10_000


@pytest.fixture
def notes() -> NoteType:
    return NoteType()


@pytest.fixture
def c(make_coordinator: Callable[..., Coordinator], notes: NoteType) -> Coordinator:
    return make_coordinator(registry_with(notes))


def blocked(c: Coordinator, ids: list[str]) -> list[bool]:
    with c.engine.connect() as conn:
        found: dict[str, Any] = {row[0]: row[1] for row in conn.execute(sa.text("SELECT id, blocked FROM tether_jobs"))}
    return [bool(found[i]) for i in ids]


def test_a_targets_head_is_claimed_in_order_while_10000_of_its_jobs_wait(c: Coordinator, clock: FakeClock) -> None:
    hot = [r.id for r in c.enqueue_many([Note(name=f"{i}", target="file:hot") for i in range(WAITING + 1)])]
    cold = c.enqueue(Note(name="cold", target="file:cold")).id
    plain = c.enqueue(Note(name="plain")).id

    first = c.queue.claim("w", limit=100)
    assert {j.id for j in first} == {hot[0], cold, plain}
    head = next(j for j in first if j.id == hot[0])
    # A retried head keeps its place: nothing behind it runs meanwhile.
    c.queue.finish_and_claim("w", [Decision.retry(head, "boom", clock.now() + timedelta(seconds=60))])
    assert c.queue.claim("w", limit=100) == []
    clock.advance(61)
    [head] = c.queue.claim("w", limit=100)
    assert (head.id, head.attempts) == (hot[0], 2)
    # Each completion lets exactly the next job on the target be claimed, in the commit that records it.
    for i in range(1, 6):
        _, claimed = c.queue.finish_and_claim("w", [completed(head, None)], records=False, claim=100)
        assert [j.id for j in claimed] == [hot[i]]
        head = claimed[0]
    # A failed job no longer holds back the ones after it.
    _, claimed = c.queue.finish_and_claim("w", [Decision.fail(head, "gave up")], records=False, claim=100)
    assert [j.id for j in claimed] == [hot[6]]
    assert c.get(hot[5]).status is JobStatus.FAILED
    assert [c.get(i).status for i in (hot[7], hot[-1])] == [JobStatus.PENDING] * 2


def _claim_steps(c: Coordinator) -> int:
    """SQLite virtual-machine steps of one claim of up to 100 jobs (rolled back): the work it
    does, counted exactly, whatever else the machine is doing."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    statement = SQLITE.CLAIM
    params = c.queue.backend.bind(
        {"worker": "w", "now": c.queue.clock.now(), "limit": 100, "max_bytes": 8 << 20, "types": '["note"]'}
    )
    raw = c.engine.raw_connection()
    try:
        driver: Any = raw.driver_connection
        driver.set_progress_handler(count, 1)
        try:
            claimed = driver.execute(statement, params).fetchall()
        finally:
            driver.set_progress_handler(None, 1)
            driver.rollback()
    finally:
        raw.close()
    assert len(claimed) == 2  # the hot target's head and the job without a target
    return steps


def test_a_claim_does_the_same_work_with_10000_jobs_waiting_on_a_target_as_with_10(
    tmp_path: Any, notes: NoteType
) -> None:
    steps = {}
    for waiting in (10, WAITING):
        c = Coordinator.open(
            f"sqlite:///{tmp_path / f'{waiting}.db'}", root=tmp_path / "data", registry=registry_with(notes)
        )
        try:
            c.enqueue_many([Note(name=f"{i}", target="file:hot") for i in range(waiting + 1)])
            c.enqueue(Note(name="plain"))
            steps[waiting] = _claim_steps(c)
        finally:
            c.close()
    assert steps[WAITING] <= steps[10] * 1.1, steps


@pytest.mark.parametrize("way", ["enqueue", "enqueue_many", "enqueue_many without JSON", "transaction", "keyed"])
def test_every_insert_marks_the_jobs_an_older_job_on_their_target_holds_back(c: Coordinator, way: str) -> None:
    payloads = [Note(name="a", target="t"), Note(name="b", target="u"), Note(name="c", target="t"), Note(name="d")]
    if way == "enqueue":
        ids = [c.enqueue(p).id for p in payloads]
    elif way.startswith("enqueue_many"):
        if way.endswith("without JSON"):
            c.queue.enqueuer._json_sql = None  # an SQLite without JSON functions: one executemany
        ids = [r.id for r in c.enqueue_many(payloads)]
    elif way == "transaction":
        with c.transaction() as tx:
            for p in payloads:
                tx.enqueue(p)
        ids = [r.id for r in tx.results]
    else:
        ids = [c.enqueue(p, key=f"k{i}").id for i, p in enumerate(payloads)]
    later = c.enqueue(Note(name="e", target="u")).id
    assert blocked(c, [*ids, later]) == [False, False, True, False, True]


def test_an_operator_retry_behind_an_active_job_on_its_target_waits_for_it(c: Coordinator) -> None:
    older = c.enqueue(Note(name="older", target="t", fail_times=1, permanent=True)).id
    newer = c.enqueue(Note(name="newer", target="t", fail_times=1, permanent=True)).id
    c.run_until_idle()
    assert [c.get(i).status for i in (older, newer)] == [JobStatus.FAILED] * 2
    c.retry(older)  # the newer job failed too: retrying the older one undoes nothing
    c.retry(newer)
    assert blocked(c, [older, newer]) == [False, True]
    [job] = c.queue.claim("w", limit=10)
    assert job.id == older
    _, claimed = c.queue.finish_and_claim("w", [completed(job, None)], records=False, claim=10)
    assert [j.id for j in claimed] == [newer]


def test_the_sweep_unblocks_a_target_whose_oldest_job_was_left_blocked(
    c: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    first = c.enqueue(Note(name="first", target="t")).id
    second = c.enqueue(Note(name="second", target="t")).id
    [job] = c.queue.claim("w")
    # Completed as a tether from before the flag completes it: the job behind it stays blocked.
    c.queue.backend.transact(
        lambda cur: cur.execute(
            c.queue.sql.COMPLETE,
            {"id": first, "worker": "w", "attempt": job.attempts, "now": c.queue.clock.now(), "result": None},
        )
    )
    assert c.queue.claim("w") == [] and blocked(c, [second]) == [True]
    caplog.set_level(logging.INFO, logger="tether.events")

    c.worker().sweep_once()

    assert [j.id for j in c.queue.claim("w")] == [second]
    [event] = [orjson.loads(r.getMessage()) for r in caplog.records if '"unblocked"' in r.getMessage()]
    assert event == {"event": "unblocked", "jobs": 1}


@pytest.fixture
def pg(pg_database: str, tmp_path: Any, notes: NoteType) -> Any:
    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        drop_ledger(conn)
    engine.dispose()
    with Coordinator.open(pg_database, root=tmp_path / "data", registry=registry_with(notes)) as c:
        yield c


def test_postgres_an_enqueue_that_races_the_end_of_the_job_ahead_never_leaves_its_job_blocked(pg: Coordinator) -> None:
    from tether.ledger.backend import _Cursor

    ahead = pg.enqueue(Note(name="ahead", target="t")).id
    [job] = pg.queue.claim("w")
    backend = pg.queue.backend
    # The transaction that ends the job ahead has changed its row but not committed yet...
    ending = pg.engine.raw_connection()
    driver: Any = ending.driver_connection
    try:
        cur = _Cursor(backend, driver.cursor())
        cur.execute(
            pg.queue.sql.COMPLETE,
            {"id": ahead, "worker": "w", "attempt": job.attempts, "now": pg.queue.clock.now(), "result": None},
        )
        pg.queue.unblock_next(cur, [job])
        # ... when a job behind it is enqueued in another transaction: it passes over the job being
        # ended and finds nothing else ahead of it (had it counted that job as ahead, the
        # transaction ending it would not see the new job: blocked for good).
        behind: list[str] = []
        enqueue = threading.Thread(target=lambda: behind.append(pg.enqueue(Note(name="behind", target="t")).id))
        enqueue.start()
        deadline = time.monotonic() + 10
        while enqueue.is_alive() and not _waiting_for_a_lock(pg) and time.monotonic() < deadline:
            enqueue.join(0.01)
        driver.commit()
        enqueue.join(10)
    finally:
        ending.close()
    assert blocked(pg, behind) == [False]
    assert [j.id for j in pg.queue.claim("w")] == behind


def test_postgres_a_job_enqueued_behind_one_being_completed_is_unblocked_by_that_completion(pg: Coordinator) -> None:
    from sqlalchemy.orm import Session

    pg.enqueue(Note(name="ahead", target="t"))
    [job] = pg.queue.claim("w")
    with Session(pg.engine) as session:
        # An application's transaction enqueues a job behind the running one (blocked, the job
        # ahead share-locked) and has not committed when the group commit completing it starts:
        # that commit's update waits for it, then finds the job to unblock, though no job was
        # blocked when it began.
        behind = pg.enqueue(Note(name="behind", target="t"), session=session).id
        finishing = threading.Thread(
            target=lambda: pg.queue.finish_and_claim("w", [completed(job, None)], records=False)
        )
        finishing.start()
        wait_for(lambda: _waiting_for_a_lock(pg) or not finishing.is_alive(), "the completion's update to wait", 10)
        assert finishing.is_alive()  # the completion waits for the application's transaction
        session.commit()
    finishing.join(10)
    assert blocked(pg, [behind]) == [False]
    assert [j.id for j in pg.queue.claim("w")] == [behind]


def test_postgres_an_enqueue_passes_over_the_job_ahead_being_retried_and_still_runs_after_it(
    pg: Coordinator,
) -> None:
    from tether.ledger.backend import _Cursor

    ahead = pg.enqueue(Note(name="ahead", target="t")).id
    [job] = pg.queue.claim("w")
    # The transaction that gives the job ahead back for a retry has changed its row, not committed...
    retrying = pg.engine.raw_connection()
    driver: Any = retrying.driver_connection
    behind: list[str] = []
    try:
        cur = _Cursor(pg.queue.backend, driver.cursor())
        now = pg.queue.clock.now()
        cur.execute(
            pg.queue.sql.RETRY, {"id": ahead, "worker": "w", "attempt": job.attempts, "run_at": now, "error": "x"}
        )
        # ... when a job behind it is enqueued: it never waits for that row lock (waiting on the jobs
        # of many targets is how a batch enqueue deadlocked with a group commit).
        enqueue = threading.Thread(target=lambda: behind.append(pg.enqueue(Note(name="behind", target="t")).id))
        enqueue.start()
        deadline = time.monotonic() + 10
        while enqueue.is_alive() and not _waiting_for_a_lock(pg) and time.monotonic() < deadline:
            enqueue.join(0.01)
        returned_first = not enqueue.is_alive()
        driver.commit()
        enqueue.join(10)
    finally:
        retrying.close()
    assert returned_first, "the enqueue waited for the transaction changing the job ahead"
    # Its flag could not say the job ahead holds it back; the claim asks the rule itself.
    assert blocked(pg, behind) == [False]
    [again] = pg.queue.claim("w", limit=10)
    assert again.id == ahead
    pg.queue.finish_and_claim("w", [completed(again, None)])
    assert [j.id for j in pg.queue.claim("w", limit=10)] == behind


def _waiting_for_a_lock(c: Coordinator) -> bool:
    query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    with c.engine.connect() as conn:
        return bool(conn.execute(sa.text(query)).scalar_one())
