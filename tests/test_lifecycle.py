"""Every edge of the lifecycle, on SQLite and PostgreSQL (the `db_url` fixture is parametrised)."""

from __future__ import annotations

import errno
import logging
import os
import threading
from datetime import UTC
from typing import Any

import orjson
import pytest
import sqlalchemy as sa

from jobkit import Block, BlockType, Note, NoteType, Spawn, SpawnType, completed, registry_with
from tether import (
    Coordinator,
    CreateFile,
    DuplicateActiveJob,
    InvalidTransition,
    JobNotFound,
    JobStatus,
)
from tether.errors import Cancelled, PermanentError
from tether.ledger.lifecycle import Decision
from tether.testing import drain, refute_enqueued
from tether.worker.completer import NOT_RUN, Unrecordable
from tether.worker.executor import Returned


@pytest.fixture
def notes():
    return NoteType()


@pytest.fixture
def c(make_coordinator, notes):
    return make_coordinator(registry_with(notes, BlockType(), SpawnType()))


def events_named(caplog, name):
    return [
        orjson.loads(r.getMessage())
        for r in caplog.records
        if r.name == "tether.events" and orjson.loads(r.getMessage())["event"] == name
    ]


def test_enqueue_records_a_pending_job_with_defaults(c, clock):
    job = c.enqueue(Note(name="a")).job
    stored = c.get(job.id)
    assert stored.status is JobStatus.PENDING
    assert (stored.attempts, stored.max_attempts, stored.priority) == (0, 3, 0)
    assert stored.created_at == clock.now() == stored.run_at
    assert stored.locked_by is None and stored.payload_data == {"name": "a", "fail_times": 0, "permanent": False}


def test_a_single_enqueue_stores_exactly_the_row_it_returns(c, clock):
    for options in ({}, {"priority": 4, "max_attempts": 5, "timeout": 7.5, "delay": 30}):
        job = c.enqueue(Note(name="a"), **options).job
        assert c.get(job.id) == job
        assert job.payload_bytes == len(job.payload.encode())


def test_a_type_registered_again_with_hooks_takes_effect_on_the_next_single_enqueue(c):
    # The builder keeps each payload class's hooks; a new registration must retire them, or the
    # new type's hooks would be skipped.
    class KeyedSpawnType(SpawnType):
        def idempotency_key(self, payload: Spawn) -> str | None:
            return ",".join(payload.children)

    assert c.enqueue(Spawn(children=["a"])).job.idempotency_key is None  # SpawnType: no hooks
    c.registry.register(KeyedSpawnType())
    keyed = c.enqueue(Spawn(children=["a"]))
    assert keyed.job.idempotency_key == "a" and not keyed.duplicate
    assert c.enqueue(Spawn(children=["a"])).duplicate


def test_claim_sets_owner_lock_time_and_counts_the_attempt(c, clock):
    c.enqueue(Note(name="a"))
    [job] = c.queue.claim("w1")
    assert job.status is JobStatus.CLAIMED
    assert (job.locked_by, job.locked_at, job.claimed_at, job.attempts) == ("w1", clock.now(), clock.now(), 1)
    assert c.queue.claim("w2") == []


def test_claim_takes_highest_priority_first_then_oldest(c, clock):
    ids = {}
    for name, prio in [("low-old", 0), ("high", 5), ("low-new", 0), ("mid", 1)]:
        ids[name] = c.enqueue(Note(name=name), priority=prio).id
        clock.advance(1)
    order = [c.queue.claim("w")[0].id for _ in range(4)]
    assert order == [ids["high"], ids["mid"], ids["low-old"], ids["low-new"]]


def test_claim_skips_jobs_whose_run_at_is_in_the_future(c, clock):
    later = c.enqueue(Note(name="later"), delay=60).id
    assert c.queue.claim("w") == []
    clock.advance(61)
    assert [j.id for j in c.queue.claim("w")] == [later]


def test_concurrent_claimers_never_get_the_same_job(c):
    c.enqueue_many([Note(name=str(i)) for i in range(40)])
    got: list[str] = []
    lock = threading.Lock()

    def claimer(n):
        while jobs := c.queue.claim(f"w{n}"):
            with lock:
                got.extend(j.id for j in jobs)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 40 == len(set(got))


def test_completed_job_keeps_the_handler_result_and_the_worker_that_ran_it(c):
    job_id = c.enqueue(Note(name="a")).id
    worker = c.worker()
    assert worker.run_once() == 1
    done = c.get(job_id)
    assert done.status is JobStatus.COMPLETED and done.result_data == {"name": "a"}
    # The lock is gone; the worker stays, as the completing attempt's (no attempt row tells it).
    assert done.completed_at is not None and done.locked_at is None and done.locked_by == worker.id


def test_a_completion_decision_holds_each_value_in_its_own_field(c, clock):
    # Decision.complete fills the NamedTuple's fields by position (make_tuple): a field added,
    # moved or left out shows here as a decision unequal to the one built by name.
    parent, child = c.enqueue(Note(name="a")).job, c.enqueue(Note(name="b")).job
    built = Decision.complete(parent, '{"ok": 1}', [child], 0.25, clock.now())
    assert built == Decision(
        job=parent,
        edge="complete",
        values={"result": '{"ok": 1}'},
        children=[child],
        duration=0.25,
        finished_at=clock.now(),
    )


def test_retryable_error_returns_the_job_to_pending_with_backoff(c, clock):
    job_id = c.enqueue(Note(name="a", fail_times=1)).id
    w = c.worker()
    w.run_once()
    job = c.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 1 and job.locked_by is None
    assert "RuntimeError: a failed on run 1" in job.last_error
    delay = (job.run_at - clock.now()).total_seconds()
    full = w.config.retry.base
    assert full / 2 <= delay <= full
    assert w.run_once() == 0  # not before run_at
    clock.advance(delay)
    assert w.run_once() == 1
    assert c.get(job_id).status is JobStatus.COMPLETED


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    import random

    from tether import RetryPolicy

    policy = RetryPolicy(base=2, cap=30, rng=random.Random(7))
    for attempt, full in [(1, 2), (2, 4), (3, 8), (4, 16), (5, 30), (9, 30)]:
        d = policy.delay(attempt).total_seconds()
        assert full / 2 <= d <= full


def test_exhausted_attempts_fail_the_job(c, clock):
    c.enqueue(Note(name="a", fail_times=5), max_attempts=2)
    first, last = drain(c, with_scheduled=True)  # the retry runs without its backoff passing
    assert (first.status, last.status, last.attempt) == (JobStatus.PENDING, JobStatus.FAILED, 2)
    assert "failed on run 2" in (last.error or "") and last.job.completed_at == clock.now()


def test_permanent_error_fails_at_once(c, notes):
    c.enqueue(Note(name="a", fail_times=1, permanent=True), max_attempts=5)
    [ran] = drain(c, with_scheduled=True)
    assert (ran.status, ran.attempt, ran.error) == (JobStatus.FAILED, 1, "PermanentError: a can never work")


def test_payload_invalid_at_run_time_fails_without_retry(c, root, tmp_path):
    (root / "link").mkdir()
    job_id = c.enqueue(CreateFile(path="link/x.json", content=1), max_attempts=5).id
    # After enqueue, the directory is swapped for a symlink that leads out of the data root.
    (root / "link").rmdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    c.worker().run_once()
    job = c.get(job_id)
    assert job.status is JobStatus.FAILED and job.attempts == 1
    assert "outside the data root" in job.last_error
    assert list(outside.iterdir()) == []


def test_a_late_worker_cannot_complete_a_reclaimed_job(c, clock, caplog):
    caplog.set_level(logging.INFO, logger="tether.events")
    job_id = c.enqueue(Note(name="a")).id
    [first] = c.queue.claim("w1")
    clock.advance(c.lock_timeout + 1)
    assert [j.id for j in c.reclaim_stale()] == [job_id]
    [second] = c.queue.claim("w2")
    assert second.attempts == 2
    late = [completed(first, {"late": True}), Decision.fail(first, "late")]
    assert c.queue.finish_and_claim("w1", late) == ([None, None], [])
    current = c.get(job_id)
    assert (current.status, current.locked_by, current.result) == (JobStatus.CLAIMED, "w2", None)
    assert [e["worker"] for e in events_named(caplog, "lost_lease")] == ["w1", "w1"]
    c.queue.finish_and_claim("w2", [completed(second, {"late": False})])
    assert c.get(job_id).result_data == {"late": False}


def test_same_worker_cannot_report_an_older_attempt(c, clock):
    c.enqueue(Note(name="a"))
    [first] = c.queue.claim("w1")
    clock.advance(c.lock_timeout + 1)
    c.reclaim_stale()
    [again] = c.queue.claim("w1")
    assert c.queue.finish_and_claim("w1", [completed(first, None)]) == ([None], [])
    [done], _ = c.queue.finish_and_claim("w1", [completed(again, None)])
    assert (done.id, done.status, done.attempts) == (first.id, JobStatus.COMPLETED, 2)


def test_stale_reclaim_does_not_count_an_attempt(c, clock):
    job_id = c.enqueue(Note(name="a")).id
    c.queue.claim("w1")
    clock.advance(c.lock_timeout - 1)
    assert c.reclaim_stale() == []
    clock.advance(2)
    [back] = c.reclaim_stale()
    assert back.status is JobStatus.PENDING and back.attempts == 1 and back.locked_by is None
    assert "lock of worker w1 expired" in back.last_error
    assert c.queue.claim("w2")[0].attempts == 2
    assert c.get(job_id).status is JobStatus.CLAIMED


def test_stale_reclaim_on_the_last_attempt_fails_the_job(c, clock):
    job_id = c.enqueue(Note(name="a"), max_attempts=1).id
    c.queue.claim("w1")
    clock.advance(c.lock_timeout + 1)
    [dead] = c.reclaim_stale()
    assert dead.id == job_id and dead.status is JobStatus.FAILED
    assert dead.last_error.startswith("worker died while running (reclaimed, attempt 1 of 1; no attempts left)")
    assert "lock of worker w1 expired" in dead.last_error


def test_heartbeat_keeps_a_slow_job_from_being_reclaimed(make_coordinator, clock):
    blocker = BlockType()
    c = make_coordinator(registry_with(blocker))
    job_id = c.enqueue(Block(name="slow")).id
    w = c.worker()
    runner = threading.Thread(target=w.run_once)
    runner.start()
    assert blocker.started.wait(10)
    for _ in range(4):  # 4 x 4 min: far past the 5 min timeout, renewed each time
        clock.advance(minutes=4)
        assert w.heartbeat_once() == []
        assert c.reclaim_stale() == []
    blocker.release.set()
    runner.join(10)
    assert c.get(job_id).status is JobStatus.COMPLETED


def test_cancel_at_checkpoint_releases_the_job_and_gives_the_attempt_back(make_coordinator):
    blocker = BlockType()
    c = make_coordinator(registry_with(blocker))
    job_id = c.enqueue(Block(name="long")).id
    w = c.worker()
    runner = threading.Thread(target=w.run_once)
    runner.start()
    assert blocker.started.wait(10)
    w.stop(cancel=True)
    runner.join(10)
    job = c.get(job_id)
    assert job.status is JobStatus.PENDING and job.attempts == 0 and job.locked_by is None


def test_decide_maps_each_outcome_to_its_transition_and_its_attempt_row(c):
    w = c.worker()
    refused = sa.exc.DataError("INSERT", {}, ValueError("a value it cannot store"))
    # The attempt row each writes: none for a completion (the job row tells it) nor for a job
    # given back before its handler started (no attempt ran).
    outcomes = [
        (Returned('{"ok": 1}', []), JobStatus.COMPLETED, 1, None, []),
        (Cancelled("stop"), JobStatus.PENDING, 0, None, ["given_back"]),
        (NOT_RUN, JobStatus.PENDING, 0, None, []),
        (RuntimeError("boom"), JobStatus.PENDING, 1, "RuntimeError: boom", ["error"]),
        (PermanentError("no"), JobStatus.FAILED, 1, "PermanentError: no", ["error"]),
        (
            Unrecordable("complete", refused),
            JobStatus.FAILED,
            1,
            "could not record this job's outcome (complete)",
            ["error"],
        ),
    ]
    for n, (outcome, status, attempts, error, rows) in enumerate(outcomes):
        c.enqueue(Note(name=str(n)))
        [job] = c.queue.claim(w.id)
        c.queue.finish_and_claim(w.id, [w.completer.decide(job, outcome, 0.0)])
        after = c.get(job.id)
        assert (after.status, after.attempts) == (status, attempts), outcome
        assert error is None or error in (after.last_error or ""), (outcome, after.last_error)
        with c.engine.connect() as conn:
            written = conn.execute(sa.text("SELECT outcome FROM tether_attempts WHERE job_id = :id"), {"id": job.id})
            assert [o for (o,) in written] == rows, outcome
        if status is not JobStatus.COMPLETED:
            with c.engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM tether_jobs WHERE id = :id"), {"id": job.id})


def test_manual_retry_resets_attempts_of_a_failed_job(c):
    job_id = c.enqueue(Note(name="a", fail_times=1, permanent=True)).id
    c.worker().run_once()
    again = c.retry(job_id)
    assert again.status is JobStatus.PENDING and again.attempts == 0 and again.completed_at is None
    c.worker().run_once()
    assert c.get(job_id).status is JobStatus.COMPLETED


def test_manual_retry_is_refused_for_jobs_that_are_not_failed(c):
    job_id = c.enqueue(Note(name="a")).id
    with pytest.raises(InvalidTransition, match="is pending; it cannot become pending"):
        c.retry(job_id)
    with pytest.raises(JobNotFound, match="no job with id 'nope'"):
        c.retry("nope")


def test_manual_retry_is_refused_while_another_job_holds_the_key(c):
    failed = c.enqueue(Note(name="a", fail_times=1, permanent=True), key="k").id
    c.worker().run_once()
    active = c.enqueue(Note(name="b"), key="k").id
    with pytest.raises(DuplicateActiveJob, match=f"job {active} is already active"):
        c.retry(failed)
    assert c.get(failed).status is JobStatus.FAILED


def test_enqueue_with_an_active_key_returns_the_existing_job(c):
    first = c.enqueue(Note(name="a"), key="k")
    second = c.enqueue(Note(name="b"), key="k")
    assert (second.id, second.duplicate, first.duplicate) == (first.id, True, False)
    c.run_until_idle()
    third = c.enqueue(Note(name="c"), key="k")
    assert not third.duplicate and third.id != first.id


def test_racing_enqueues_with_one_key_insert_one_job(c):
    results = []
    barrier = threading.Barrier(4)

    def enqueue():
        barrier.wait()
        results.append(c.enqueue(Note(name="x"), key="same"))

    threads = [threading.Thread(target=enqueue) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1


def test_jobs_enqueued_together_commit_together(c):
    with c.transaction() as tx:
        tx.enqueue(Note(name="a"))
        tx.enqueue(Note(name="b"), priority=2)
    assert [c.get(r.id).status for r in tx.results] == [JobStatus.PENDING] * 2
    with pytest.raises(RuntimeError):
        with c.transaction() as tx2:
            tx2.enqueue(Note(name="c"))
            raise RuntimeError("caller gave up")
    assert tx2.results == []
    assert c.run_until_idle() == 2


def test_enqueue_in_the_applications_session_commits_with_its_rows(c):
    from sqlalchemy.orm import Session

    with Session(c.engine) as session:
        kept = c.enqueue(Note(name="kept"), session=session).id
        session.commit()
    with Session(c.engine) as session:
        dropped = c.enqueue(Note(name="dropped"), session=session).id
        session.rollback()
    assert c.get(kept).status is JobStatus.PENDING
    with pytest.raises(JobNotFound):
        c.get(dropped)


def test_each_coordinator_sharing_an_application_session_wakes_its_own_workers_on_commit(c, tmp_path):
    from sqlalchemy.orm import Session

    other = Coordinator.open(str(c.engine.url), root=c.queue.root, registry=c.registry)
    try:
        seen = (c.queue.wakeup.generation(), other.queue.wakeup.generation())
        with Session(c.engine) as session:
            c.enqueue(Note(name="mine"), session=session)
            other.enqueue(Note(name="theirs"), session=session)
            assert (c.queue.wakeup.generation(), other.queue.wakeup.generation()) == seen  # not before the commit
            session.commit()
        assert c.queue.wakeup.generation() == seen[0] + 1
        assert other.queue.wakeup.generation() == seen[1] + 1
    finally:
        other.close()


def test_a_wakeup_swapped_on_the_queue_is_the_one_its_enqueues_and_outcomes_wake(c):
    from tether.ledger.wakeup import Wakeup

    c.queue.wakeup = swapped = Wakeup()
    c.enqueue(Note(name="a"))
    assert swapped.generation() == 1
    [job] = c.queue.claim("w")
    c.queue.finish_and_claim("w", [Decision.release(job)])
    assert swapped.generation() == 2


def test_a_single_enqueue_wakes_this_processs_workers_whether_events_are_logged_or_not(c, caplog):
    # The wake-up does not depend on the queued event being logged.
    seen = c.queue.wakeup.generation()
    quiet = c.enqueue(Note(name="quiet")).id
    assert c.queue.wakeup.generation() == seen + 1 and events_named(caplog, "queued") == []
    caplog.set_level(logging.INFO, logger="tether.events")
    logged = c.enqueue(Note(name="logged")).id
    assert c.queue.wakeup.generation() == seen + 2
    assert [e["job_id"] for e in events_named(caplog, "queued")] == [logged] != [quiet]


def test_follow_up_jobs_commit_with_the_parent_completion(c):
    parent = c.enqueue(Spawn(children=["x", "y"])).id
    c.worker().run_once()
    with c.engine.connect() as conn:
        kids = conn.execute(
            sa.text("SELECT type, parent_id FROM tether_jobs WHERE parent_id = :p"), {"p": parent}
        ).all()
    assert sorted(kids) == [("create_file", parent)] * 2
    assert c.run_until_idle() == 2


def test_a_parent_that_fails_leaves_no_children(c):
    c.enqueue(Spawn(children=["x"], fail=True))
    [parent] = drain(c, with_scheduled=True)  # no child ran after it: none was committed
    assert parent.status is JobStatus.FAILED
    refute_enqueued(c, "create_file")


def test_every_transition_writes_one_event(c, clock, caplog):
    caplog.set_level(logging.INFO, logger="tether.events")
    job_id = c.enqueue(Note(name="a", fail_times=1)).id
    w = c.worker()
    w.run_once()
    clock.advance(3600)
    w.run_once()
    names = [orjson.loads(r.getMessage())["event"] for r in caplog.records if r.name == "tether.events"]
    assert names == ["queued", "claimed", "retried", "claimed", "completed"]
    completed = events_named(caplog, "completed")[0]
    assert completed["job_id"] == job_id and completed["attempt"] == 2 and completed["worker"] == w.id
    assert "duration_ms" in completed and "payload" not in completed


def test_jobs_on_one_target_apply_in_enqueue_order_across_a_retry(make_coordinator, root, clock):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue(Note(name="old", target="file:x", fail_times=1))
    c.enqueue(Note(name="new", target="file:x"))
    c.enqueue(Note(name="other", target="file:y"))
    w = c.worker(threads=2)
    w.run_until_idle()  # old fails once and waits for its backoff; new must wait behind it
    assert [n for n, _ in notes.runs] == ["old", "other"]
    clock.advance(3600)
    c.run_until_idle(threads=2)
    assert [n for n, _ in notes.runs] == ["old", "other", "old", "new"]


def test_older_write_retried_still_lands_before_the_newer_one(make_coordinator, root, clock, monkeypatch):
    c = make_coordinator()
    # The older write fails once: an I/O error on the rename (retryable).
    real_replace, failed = os.replace, list[int]()

    def replace_failing_once(*args, **kwargs):
        if not failed:
            failed.append(1)
            raise OSError(errno.EIO, "injected I/O error")
        return real_replace(*args, **kwargs)

    monkeypatch.setattr(os, "replace", replace_failing_once)
    c.enqueue(CreateFile(path="doc.json", content={"v": 1}, overwrite=True))
    c.enqueue(CreateFile(path="doc.json", content={"v": 2}, overwrite=True))
    c.run_until_idle(threads=4)
    assert failed and not (root / "doc.json").exists()
    clock.advance(3600)
    c.run_until_idle(threads=4)
    assert orjson.loads((root / "doc.json").read_bytes()) == {"v": 2}


def test_jobs_on_different_targets_are_claimed_together(c):
    c.enqueue(Note(name="a", target="t1"))
    c.enqueue(Note(name="b", target="t1"))
    c.enqueue(Note(name="c", target="t2"))
    claimed = c.queue.claim("w", limit=10)
    assert sorted(j.payload_data["name"] for j in claimed) == ["a", "c"]


def test_a_failed_job_no_longer_holds_back_its_target(c):
    c.enqueue(Note(name="a", target="t", fail_times=1, permanent=True))
    later = c.enqueue(Note(name="b", target="t")).id
    c.worker().run_once()
    assert [j.id for j in c.queue.claim("w")] == [later]


def test_bulk_enqueue_returns_exactly_the_rows_it_stored(c):
    results = c.enqueue_many([Note(name="a"), Note(name="b")], priority=3)
    keyed = c.enqueue_many([Note(name="c"), Note(name="d")], key="same")
    assert [c.get(r.id) for r in results] == [r.job for r in results]
    assert [r.duplicate for r in keyed] == [False, True] and keyed[0].id == keyed[1].id


@pytest.mark.parametrize("way", ["json", "json in small parts", "executemany"])
def test_jobs_inserted_together_are_stored_exactly_as_each_was_built(c, clock, way, monkeypatch):
    """Many jobs in one transaction go in one statement per shared set of options (rows read from
    JSON, split where the payloads are large), or one executemany where the database has no JSON
    functions: either way every column of every row is what was built, payload text included."""
    from tether.ledger import enqueue

    if way == "executemany":
        c.queue.enqueuer._json_sql = None
    elif way == "json in small parts":
        monkeypatch.setattr(enqueue, "_JSON_CHARS", 40)
    names = ["plain", 'quote " backslash \\ slash /', "tab\tnewline\n", "caf\u00e9 \u2603 \U0001f600", "nul\x00"]
    with c.transaction() as tx:
        for name in names:
            tx.enqueue(Note(name=name))  # untargeted, each its own enqueue time
        tx.enqueue(Note(name="late"), delay=30)
    many = c.enqueue_many([Note(name=n, target=f"t{i % 2}") for i, n in enumerate(names)], priority=2)
    untargeted = c.enqueue_many([Note(name=n) for n in names], max_attempts=7)
    clock.advance(1)
    mixed = c.enqueue_many([Note(name="x", target="t9"), Note(name="y"), Note(name="z", target="t9")])
    results = tx.results + many + untargeted + mixed
    stored = [c.get(r.id) for r in results]
    assert stored == [r.job for r in results]
    assert [orjson.loads(j.payload)["name"] for j in stored[-8:-3]] == names
    assert [j.ordering_key for j in stored[6:11]] == ["t0", "t1", "t0", "t1", "t0"]
    assert {j.max_attempts for j in stored[11:16]} == {7} and {j.priority for j in stored[6:11]} == {2}
    assert [j.ordering_key for j in stored[-3:]] == ["t9", None, "t9"]
    assert stored[5].run_at > stored[5].created_at


def test_a_json_insert_is_split_where_its_payloads_pass_the_size_cap(monkeypatch):
    from collections import namedtuple

    from tether.ledger import enqueue

    Job = namedtuple("Job", "payload")
    monkeypatch.setattr(enqueue, "_JSON_CHARS", 10)
    jobs: list[Any] = [Job("x" * n) for n in (4, 4, 4, 30, 2, 3)]  # stand-ins: only .payload is read
    parts = list(enqueue._by_size(jobs))
    assert [[len(j.payload) for j in part] for part in parts] == [[4, 4], [4], [30], [2, 3]]
    assert [j for part in parts for j in part] == jobs  # every job once, in order


def test_a_rolled_back_session_reports_no_jobs_on_its_next_commit(c, caplog):
    from sqlalchemy.orm import Session

    caplog.set_level(logging.INFO, logger="tether.events")
    with Session(c.engine) as session:
        c.enqueue(Note(name="dropped"), session=session)
        session.rollback()
        kept = c.enqueue(Note(name="kept"), session=session).id
        session.commit()
        session.commit()  # a later, unrelated commit reports nothing again
    assert [e["job_id"] for e in events_named(caplog, "queued")] == [kept]


def test_retrying_an_old_failure_may_not_undo_a_newer_job_on_its_target(c):
    from tether import Superseded

    old = c.enqueue(Note(name="old", target="file:x", fail_times=1, permanent=True)).id
    c.worker().run_once()
    newer = c.enqueue(Note(name="new", target="file:x")).id
    with pytest.raises(Superseded, match=f"job {newer}, enqueued after it for x"):
        c.retry(old)
    assert c.get(old).status is JobStatus.FAILED


def test_job_ids_are_ulids_in_enqueue_order_even_within_one_millisecond(monkeypatch):
    from datetime import datetime

    from ulid import ULID

    from tether.ledger import ids
    from tether.ledger.ids import new_id

    monkeypatch.setattr(ids, "_last", (-1, ""))  # and restored: later tests keep real-time ids

    now = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)
    made = [new_id(now) for _ in range(1000)]
    assert made == sorted(made) and len(set(made)) == 1000
    assert ULID.from_str(made[0]).datetime == now


def test_job_ids_encode_like_the_ulid_reference_for_any_128_bit_value():
    import random

    from ulid import ULID

    from tether.ledger.ids import _encode

    rng = random.Random(7)
    values = [0, 1, 2**80 - 1, 2**80, 2**128 - 1] + [rng.getrandbits(128) for _ in range(5000)]
    assert [_encode(v) for v in values] == [str(ULID.from_int(v)) for v in values]


def test_the_library_and_cli_import_without_test_only_packages():
    import subprocess
    import sys

    # python-ulid is a test dependency: nothing tether runs may need it.
    code = (
        "import sys; sys.modules['ulid'] = None;"
        " import tether, tether.cli, tether.observe.jobs, tether.demo.app; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout == "ok\n", done.stderr[-2000:]


def test_the_id_floor_of_a_moment_sorts_before_every_id_made_at_or_after_it(monkeypatch):
    from datetime import datetime, timedelta

    from ulid import ULID

    from tether.ledger import ids
    from tether.ledger.ids import floor_id, new_id

    monkeypatch.setattr(ids, "_last", (-1, ""))  # ids made earlier in this process are later than `when`

    when = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
    floor = floor_id(when)
    assert ULID.from_str(floor).datetime == when.replace(microsecond=123000)
    assert new_id(when - timedelta(milliseconds=1)) < floor <= new_id(when)
