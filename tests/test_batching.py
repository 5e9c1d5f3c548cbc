"""Claiming several jobs per transaction and recording their outcomes in group commits."""

from __future__ import annotations

import sqlalchemy as sa

from tether import Coordinator, JobStatus
from tether.queue import Decision
from jobkit import Note, NoteType, registry_with


def write_transactions(c: Coordinator) -> list[str]:
    statements: list[str] = []
    c.engine.dispose()
    sa.event.listen(c.engine, "connect", lambda dbapi, _rec: dbapi.set_trace_callback(statements.append))
    return statements


def test_a_batch_is_claimed_in_one_transaction_and_recorded_in_one_more(tmp_path):
    notes = NoteType()
    with Coordinator.open(f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path / "data", registry=registry_with(notes)) as c:
        c.enqueue_many([Note(name=str(i)) for i in range(20)])
        statements = write_transactions(c)
        assert c.worker(batch=20, flush_after=60).run_once() == 20
        assert statements.count("BEGIN IMMEDIATE") == 2 and statements.count("COMMIT") == 2
        assert {c.get(r).status for r in _ids(c)} == {JobStatus.COMPLETED}


def _ids(c: Coordinator) -> list[str]:
    with c.engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT id FROM tether_jobs")).scalars())


def test_finished_jobs_wait_at_most_flush_after_for_their_commit(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name=str(i)) for i in range(5)])
    recorded = []
    real = c.queue.finish
    c.queue.finish = lambda worker, decisions: recorded.append(len(decisions)) or real(worker, decisions)
    c.worker(batch=5, flush_after=0).run_once()
    assert recorded == [1, 1, 1, 1, 1]


def test_stopping_mid_batch_gives_unstarted_jobs_back(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name=str(i)) for i in range(6)])
    w = c.worker(batch=6)
    original = notes.run

    def run_then_stop(payload, ctx):
        w.stop()  # a signal arrives while the first job runs
        return original(payload, ctx)

    notes.run = run_then_stop
    assert w.run_once() == 1
    statuses = sorted((c.get(i).status.value, c.get(i).attempts) for i in _ids(c))
    assert statuses == [("completed", 1)] + [("pending", 0)] * 5


def test_slow_jobs_are_claimed_one_at_a_time(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name=str(i)) for i in range(6)])
    w = c.worker(batch=6, slow_job=0)  # every job counts as slow
    assert w.run_once() == 6  # nothing known yet: a full batch
    c.enqueue_many([Note(name=f"b{i}") for i in range(3)])
    assert w.run_once() == 1


def test_a_lost_lease_in_a_group_commit_spares_the_other_jobs(make_coordinator, clock):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name="a"), Note(name="b")])
    a, b = c.queue.claim("w1", limit=2)
    clock.advance(c.lock_timeout + 1)
    c.reclaim_stale()
    [a2, b2] = c.queue.claim("w2", limit=2)
    # w1 still holds nothing; w2 reports both, but a was stolen back by nobody: simulate w1's late batch
    moved = c.queue.finish("w1", [Decision.complete(a, None), Decision.complete(b, None)])
    assert moved == [None, None]
    moved = c.queue.finish("w2", [Decision.complete(a2, {"ok": 1}), Decision(b2, "fail", {"error": "x"})])
    assert [m.status for m in moved] == [JobStatus.COMPLETED, JobStatus.FAILED]
