"""Claiming several jobs per transaction and recording their outcomes in group commits."""

from __future__ import annotations

import time

import sqlalchemy as sa

from jobkit import Note, NoteType, completed, registry_with
from tether import Coordinator, JobStatus
from tether.ledger.lifecycle import Decision


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


def test_a_draining_worker_claims_the_next_batch_in_the_commit_that_records_the_last(tmp_path):
    notes = NoteType()
    with Coordinator.open(f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path / "data", registry=registry_with(notes)) as c:
        c.enqueue_many([Note(name=str(i)) for i in range(60)])
        statements = write_transactions(c)
        assert c.worker(batch=20, flush_after=60).run_until_idle() == 60
        # the stale sweep, the worker's row in the register, one claim, three record-and-claim
        # commits (the last finds nothing), one empty claim, the register's stop mark; recording
        # and claiming apart would take three more
        writes = [s for s in statements if s == "BEGIN IMMEDIATE"]
        assert len(writes) == 8, statements
        assert {c.get(r).status for r in _ids(c)} == {JobStatus.COMPLETED}


def test_jobs_claimed_with_the_last_outcomes_go_back_when_the_worker_stops(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name=str(i)) for i in range(10)])
    w = c.worker(batch=4, flush_after=60)
    real = c.queue.finish_and_claim

    def then_stop(worker, decisions, **kw):
        moved, taken = real(worker, decisions, **kw)
        w.stop()  # a signal arrives right after the commit that took the next batch
        return moved, taken

    c.queue.finish_and_claim = then_stop
    assert w.run_until_idle() == 4
    statuses = sorted((c.get(i).status.value, c.get(i).attempts) for i in _ids(c))
    assert statuses == [("completed", 1)] * 4 + [("pending", 0)] * 6


def _ids(c: Coordinator) -> list[str]:
    with c.engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT id FROM tether_jobs")).scalars())


def test_finished_jobs_wait_at_most_flush_after_for_their_commit(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name=str(i)) for i in range(5)])
    recorded = []
    real = c.queue.finish_and_claim
    c.queue.finish_and_claim = lambda worker, decisions, **kw: (
        recorded.append(len(decisions)) or real(worker, decisions, **kw)
    )
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


def test_a_slow_job_gives_the_rest_of_its_batch_back_and_later_claims_are_single(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name=str(i)) for i in range(6)])
    w = c.worker(batch=6, slow_job=0)  # every job counts as slow
    assert w.run_once() == 1  # the other five go back for any worker to take, attempts untouched
    assert (
        sorted((c.get(i).status.value, c.get(i).attempts) for i in _ids(c)) == [("completed", 1)] + [("pending", 0)] * 5
    )
    claimed = []
    real = c.queue.claim
    c.queue.claim = lambda *a, **kw: claimed.append(kw["limit"]) or real(*a, **kw)
    assert w.run_once() == 1 and claimed == [1]


def test_one_slow_job_among_fast_ones_keeps_its_batch(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name=str(i)) for i in range(6)])
    original = notes.run

    def run(payload, ctx):
        if payload.name == "3":
            time.sleep(0.3)  # past slow_job alone; the batch's mean stays well under it
        return original(payload, ctx)

    notes.run = run
    w = c.worker(batch=6, slow_job=0.2, flush_after=60)
    assert w.run_once() == 6
    assert not w.producer.slow


def test_a_finished_job_is_recorded_before_a_slow_one_starts(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name="fast"), Note(name="slow")])
    w = c.worker(batch=2, flush_after=0, slow_job=60)
    seen = {}
    original = notes.run

    def run(payload, ctx):
        if payload.name == "slow":
            first = [i for i in _ids(c) if c.get(i).payload_data["name"] == "fast"][0]
            seen["fast"] = c.get(first).status
        return original(payload, ctx)

    notes.run = run
    assert w.run_once() == 2
    assert seen["fast"] is JobStatus.COMPLETED


def test_a_result_that_is_not_json_fails_the_job_and_spares_the_batch(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    ids = [r.id for r in c.enqueue_many([Note(name="a"), Note(name="bad"), Note(name="c")])]
    original = notes.run
    notes.run = lambda payload, ctx: {"when": {1, 2}} if payload.name == "bad" else original(payload, ctx)
    assert c.worker(batch=3).run_once() == 3
    statuses = [c.get(i).status for i in ids]
    assert statuses == [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.COMPLETED]
    assert "returned a result that is not JSON" in c.get(ids[1]).last_error


def test_a_lost_lease_in_a_group_commit_spares_the_other_jobs(make_coordinator, clock):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name="a"), Note(name="b")])
    a, b = c.queue.claim("w1", limit=2)
    clock.advance(c.lock_timeout + 1)
    c.reclaim_stale()
    # A dead worker's batch-mates come back quarantined: claimed one at a time.
    [a2], [b2] = c.queue.claim("w2", limit=2), c.queue.claim("w2", limit=2)
    # w1 still holds nothing; w2 reports both, but a was stolen back by nobody: simulate w1's late batch
    moved, _ = c.queue.finish_and_claim("w1", [completed(a, None), completed(b, None)])
    assert moved == [None, None]
    assert c.queue.finish_and_claim("w1", [completed(a, None)], records=False) == (
        [None],
        [],
    )  # the worker's path
    moved, _ = c.queue.finish_and_claim("w2", [completed(a2, {"ok": 1}), Decision(b2, "fail", {"error": "x"})])
    assert [m.status for m in moved] == [JobStatus.COMPLETED, JobStatus.FAILED]


def test_a_group_commit_completes_many_in_one_statement_fenced_job_by_job(make_coordinator, clock):
    from datetime import timedelta

    c = make_coordinator(registry_with(NoteType()))
    ids = [r.id for r in c.enqueue_many([Note(name=str(i)) for i in range(5)])]
    first = c.queue.claim("w1", limit=1)
    clock.advance(c.lock_timeout + 1)
    c.reclaim_stale()
    [stolen] = c.queue.claim("w2", limit=1)  # w1 no longer holds the first job
    mine = first + c.queue.claim("w1", limit=4)
    start = clock.now()
    decisions = [
        completed(job, {"n": i, "text": 'quote " and \\'}, finished_at=start + timedelta(seconds=i))
        for i, job in enumerate(mine)
    ]
    statements = write_transactions(c) if c.engine.dialect.name == "sqlite" else None
    moved, _ = c.queue.finish_and_claim("w1", decisions + [Decision(mine[0], "fail", {"error": "late"})], records=False)
    assert moved == [None, True, True, True, True, None]
    if statements is not None:  # one text: CPython traces a statement again for each trigger it runs
        assert len({s for s in statements if "SET status = 'completed'" in s}) == 1
    jobs = [c.get(i) for i in ids]
    assert jobs[0].status is JobStatus.CLAIMED and jobs[0].locked_by == "w2" and stolen.id == ids[0]
    assert [j.status for j in jobs[1:]] == [JobStatus.COMPLETED] * 4
    assert [j.result_data for j in jobs[1:]] == [{"n": i, "text": 'quote " and \\'} for i in range(1, 5)]
    assert [j.completed_at for j in jobs[1:]] == [start + timedelta(seconds=i) for i in range(1, 5)]
    # The lock goes; the worker stays, as the completing attempt's (no attempt row tells it).
    assert all(j.locked_by == "w1" and j.locked_at is None for j in jobs[1:])


def test_a_stale_attempt_beside_the_current_one_in_a_group_commit_is_refused(make_coordinator, clock):
    c = make_coordinator(registry_with(NoteType()))
    c.enqueue_many([Note(name="a"), Note(name="b")])
    [old] = c.queue.claim("w1", limit=1)
    clock.advance(c.lock_timeout + 1)
    c.reclaim_stale()
    again = c.queue.claim("w1", limit=2)  # the reclaimed job is quarantined: claimed alone
    assert [j.id for j in again] == [old.id]
    again += c.queue.claim("w1", limit=2)
    current = next(j for j in again if j.id == old.id)
    other = next(j for j in again if j.id != old.id)
    assert current.attempts == old.attempts + 1
    decisions = [completed(j, None) for j in (current, old, other)]
    assert c.queue.finish_and_claim("w1", decisions, records=False) == ([True, None, True], [])
    assert c.get(old.id).status is JobStatus.COMPLETED and c.get(other.id).status is JobStatus.COMPLETED


def test_an_outcome_the_database_refuses_fails_that_job_and_records_the_rest(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    ids = [r.id for r in c.enqueue_many([Note(name="a"), Note(name="refused"), Note(name="c")])]
    real = c.queue.finish_and_claim

    def finish(worker, decisions, **kw):
        if any(d.job.id == ids[1] and d.edge == "complete" for d in decisions):
            raise sa.exc.DataError("UPDATE", {}, Exception("value too long"))
        return real(worker, decisions, **kw)

    c.queue.finish_and_claim = finish
    assert c.worker(batch=3).run_once() == 3
    assert [c.get(i).status for i in ids] == [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.COMPLETED]
    assert "could not record this job's outcome (complete)" in c.get(ids[1]).last_error


def test_a_worker_that_lost_its_lock_does_not_write_late(make_coordinator, root, clock):
    from tether import CreateFile

    c = make_coordinator()
    old = c.enqueue(CreateFile(path="doc.json", text="old", overwrite=True)).id
    [stale] = c.queue.claim("paused-worker")
    clock.advance(c.lock_timeout + 1)
    c.reclaim_stale()
    c.enqueue(CreateFile(path="doc.json", text="new", overwrite=True))
    c.run_until_idle()  # the old job re-runs, then the new one
    assert (root / "doc.json").read_text() == "new"
    # The paused worker wakes and runs its stale attempt: it must not write.
    import threading

    from tether.jobtypes.context import JobContext

    job_type = c.registry.get("create_file")
    # paused past its lock timeout: its trust in the claim (half of that) ran out long ago
    ctx = JobContext(
        stale, c.queue, threading.Event(), "paused-worker", trusted_until=time.monotonic() - c.lock_timeout / 2
    )
    with __import__("pytest").raises(Exception, match="lost its lock"):
        job_type.run(c.registry.parse("create_file", stale.payload), ctx)
    assert (root / "doc.json").read_text() == "new" and c.get(old).status is JobStatus.COMPLETED


def test_a_lease_younger_than_half_the_lock_timeout_is_confirmed_without_a_read(make_coordinator, monkeypatch):
    import threading

    from tether import CreateFile
    from tether.jobtypes.context import JobContext

    c = make_coordinator()
    c.enqueue(CreateFile(path="doc.json", text="x"))
    [job] = c.queue.claim("w")
    asked = []
    real = c.queue.holds
    monkeypatch.setattr(c.queue, "holds", lambda *a, **k: asked.append(1) or real(*a, **k))
    now = [1000.0]
    monkeypatch.setattr("tether.jobtypes.context.elapsed", lambda: now[0])
    ctx = JobContext(job, c.queue, threading.Event(), "w", trusted_until=1000.0 + c.lock_timeout / 2)
    now[0] += c.lock_timeout / 2 - 1
    ctx.confirm_lease()
    assert asked == []
    now[0] += 2  # past half the lock timeout since the claim: only the ledger knows
    ctx.confirm_lease()
    assert asked == [1]


def test_the_worker_trusts_a_claim_for_half_the_lock_timeout_from_before_its_statement_only_on_one_machine(
    make_coordinator, monkeypatch
):
    """SQLite's workers share one machine's clocks: the claim is trusted for half the lock
    timeout. PostgreSQL's may be on machines paused apart (a paused VM): none is trusted, and
    the ledger is asked before every effect."""
    from tether import CreateFile
    from tether.clock import elapsed
    from tether.jobtypes import context

    c = make_coordinator()
    c.enqueue(CreateFile(path="doc.json", text="x"))
    seen = []
    real_init = context.JobContext.__init__

    def init(self, *a, **k):
        seen.append(k["trusted_until"])
        real_init(self, *a, **k)

    monkeypatch.setattr(context.JobContext, "__init__", init)
    before = elapsed()
    w = c.worker(lock_timeout=60)
    assert w.run_once() == 1
    if c.queue.backend.one_machine:
        assert before + 30 <= seen[0] <= elapsed() + 30
    else:
        assert seen == [None]


def test_an_outcome_refused_with_an_error_that_wraps_no_driver_error_fails_the_job(make_coordinator):
    # A pool timeout is an SQLAlchemyError with no driver error (.orig) inside it.
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    job = c.enqueue(Note(name="a"))
    real = c.queue.finish_and_claim
    refused: list[list[str]] = []

    def refuse_once(worker, decisions, **kw):
        if not refused:
            refused.append([d.edge for d in decisions])
            raise sa.exc.TimeoutError("QueuePool limit reached")
        return real(worker, decisions, **kw)

    c.queue.finish_and_claim = refuse_once
    assert c.worker(batch=1).run_once() == 1
    assert refused == [["complete"]]
    failed = c.get(job.id)
    assert failed.status is JobStatus.FAILED
    assert failed.last_error == (
        "tether could not record this job's outcome (complete): TimeoutError: QueuePool limit reached"
    )


def test_a_batch_in_flight_stays_under_the_garbage_collectors_threshold(tmp_path):
    # What a worker keeps alive per job until the batch's group commit (the job, its context,
    # its decision) counts towards the cyclic collector's next pass; at 8 objects a job a batch
    # of 100 crossed its threshold (700) every batch and, in a fresh process, set off a full
    # collection of the application's whole heap (benchmarks/README.md, issue 19). Events off:
    # logging each claim allocates too, and is not what this counts.
    import gc
    import logging

    peak = [0]

    class Counting(NoteType):
        def run(self, payload, ctx):
            peak[0] = max(peak[0], gc.get_count()[0])

    with Coordinator.open(
        f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path / "data", registry=registry_with(Counting())
    ) as c:
        c.enqueue_many([Note(name=str(i)) for i in range(100)])
        w = c.worker(batch=100, flush_after=60)
        events = logging.getLogger("tether.events")
        level = events.level
        events.setLevel(logging.WARNING)
        gc.collect()
        gc.disable()
        try:
            start = gc.get_count()[0]
            assert w.run_once() == 100
        finally:
            gc.enable()
            events.setLevel(level)
    assert peak[0] - start < gc.get_threshold()[0], f"{peak[0] - start} objects tracked for a batch of 100"


def _held_until_met(other, backend):
    """Take the write lock on ``other`` (another process's writer) and give it back once a claim
    has met it (``backend.lock_waits`` moved): every claim waits, however late it comes."""
    import threading

    other.execute("BEGIN IMMEDIATE")
    seen = backend.lock_waits

    def release() -> None:
        deadline = time.monotonic() + 30
        while backend.lock_waits == seen and time.monotonic() < deadline:
            time.sleep(0.001)
        other.execute("COMMIT")

    releaser = threading.Thread(target=release)
    releaser.start()
    return releaser


def test_claims_grow_while_the_write_lock_is_contended_and_shrink_once_it_is_free(tmp_path):
    import sqlite3

    db = tmp_path / "l.db"
    with Coordinator.open(f"sqlite:///{db}", root=tmp_path / "data", registry=registry_with(NoteType())) as c:
        c.enqueue_many([Note(name=str(i)) for i in range(300)])
        backend = c.queue.backend
        w = c.worker(batch=10, max_batch=40, flush_after=60)
        other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)  # another process's writer
        try:
            # Each claim meets the lock held: the next doubles, once a batch has shown the jobs fast.
            for expected in (10, 10, 20, 40, 40):
                releaser = _held_until_met(other, backend)
                assert w.run_once() == expected
                releaser.join()
            assert w.run_once() == 40  # the lock is free: the next claim halves ...
            assert w.run_once() == 20
            assert w.run_once() == 10  # ... down to batch
            assert w.run_once() == 10
        finally:
            other.close()
        # Every batch takes longer than half a group commit's window: the claims never grow.
        slow = c.worker(batch=10, max_batch=40, flush_after=1e-9)
        other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        try:
            for _ in range(3):
                releaser = _held_until_met(other, backend)
                assert slow.run_once() == 10
                releaser.join()
        finally:
            other.close()
