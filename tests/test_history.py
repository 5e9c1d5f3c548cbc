"""A target's whole history (``Coordinator.history``, ``tether history``): every job on it and every
attempt of each, told by the attempt rows the transitions write and by the job rows; and purge,
which takes a job's attempts with it and keeps what history and reconcile need (SQLite and
PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
import sqlalchemy as sa

from clikit import run_main
from jobkit import Block, BlockType, Note, NoteType, registry_with
from tether import JobStatus
from tether.errors import UnknownTarget
from tether.ledger.lifecycle import Decision
from tether.observe.history import ATTEMPT, ENQUEUED, MANUAL_RETRY

TARGET = "file:notes/a.json"


@pytest.fixture
def notes():
    return NoteType()


@pytest.fixture
def c(make_coordinator, notes):
    return make_coordinator(registry_with(notes, BlockType()))


def attempt_rows(c) -> list[tuple]:
    with c.engine.connect() as conn:
        return conn.execute(sa.text("SELECT job_id, attempt, outcome FROM tether_attempts ORDER BY id")).all()


def drain(c, clock, worker) -> None:
    """Run every job, letting each retry's backoff pass."""
    for _ in range(20):
        if worker.run_once() == 0 and c.stats().outstanding == 0:
            return
        clock.advance(3600)
    raise AssertionError("jobs still outstanding")


def story(c, target: str = "notes/a.json") -> list[tuple]:
    return [(e.kind, e.job_id, e.attempt, e.outcome) for e in c.history(target).entries]


def test_history_tells_each_failed_attempt_and_the_completing_one_in_order(c, clock):
    job_id = c.enqueue(Note(name="a", target=TARGET, fail_times=2), max_attempts=4).id
    worker = c.worker()
    drain(c, clock, worker)

    assert story(c) == [
        (ENQUEUED, job_id, None, None),
        (ATTEMPT, job_id, 1, "error"),
        (ATTEMPT, job_id, 2, "error"),
        (ATTEMPT, job_id, 3, "completed"),
    ]
    entries = c.history("notes/a.json").entries
    assert [e.detail for e in entries[1:3]] == ["RuntimeError: a failed on run 1", "RuntimeError: a failed on run 2"]
    assert {e.worker for e in entries[1:]} == {worker.id}
    # The completing attempt has no row of its own: the completed job row tells it.
    assert attempt_rows(c) == [(job_id, 1, "error"), (job_id, 2, "error")]
    assert entries[3].ended_at == c.get(job_id).completed_at


def test_a_first_attempt_that_completes_writes_no_attempt_row(c, clock):
    ids = [r.job.id for r in c.enqueue_many([Note(name=f"n{i}", target=f"file:{i}.json") for i in range(5)])]
    worker = c.worker()
    drain(c, clock, worker)
    assert attempt_rows(c) == []
    [(kind, _, attempt, outcome)] = story(c, "3.json")[1:]
    assert (kind, attempt, outcome) == (ATTEMPT, 1, "completed")
    assert c.get(ids[3]).locked_by == worker.id


def test_an_attempt_past_its_timeout_is_told_as_a_timeout(c, clock):
    job_id = c.enqueue(Block(name="slow"), timeout=0.05, max_attempts=1).id
    c.worker().run_once()
    assert c.get(job_id).status is JobStatus.FAILED
    assert attempt_rows(c) == [(job_id, 1, "timeout")]


def test_a_dead_workers_attempt_is_told_as_reclaimed_and_an_operators_retry_as_such(c, clock):
    job_id = c.enqueue(Note(name="a", target=TARGET), max_attempts=1).id
    [claimed] = c.queue.claim("w-dead")
    clock.advance(c.lock_timeout + 1)
    c.reclaim_stale()  # its only attempt: the job fails
    assert c.get(job_id).status is JobStatus.FAILED
    c.retry(job_id)
    clock.advance(1)
    c.worker().run_once()

    assert story(c) == [
        (ENQUEUED, job_id, None, None),
        (ATTEMPT, job_id, 1, "reclaimed"),
        (MANUAL_RETRY, job_id, 1, "manual_retry"),
        (ATTEMPT, job_id, 1, "completed"),
    ]
    reclaimed = c.history(TARGET).entries[1]
    assert reclaimed.worker == "w-dead" and reclaimed.at == claimed.claimed_at
    assert reclaimed.detail is not None and reclaimed.detail.startswith("worker died while running")


def test_an_attempt_given_back_is_told_as_given_back(c, clock):
    job_id = c.enqueue(Note(name="a", target=TARGET)).id
    [job] = c.queue.claim("w1")
    c.queue.finish_and_claim("w1", [Decision.release(job)], records=False)
    assert attempt_rows(c) == [(job_id, 1, "given_back")]
    assert story(c)[-1] == (ATTEMPT, job_id, 1, "given_back")


def test_history_interleaves_the_jobs_of_a_target_by_time_and_names_aws_targets_as_reconcile_does(c, clock):
    key = "aws:s3_bucket:eu-west-1:logs"
    first = c.enqueue(Note(name="a", target=key, fail_times=1)).id
    clock.advance(1)
    second = c.enqueue(Note(name="b", target=key)).id
    c.enqueue(Note(name="other", target="aws:s3_bucket:eu-west-1:other"))
    drain(c, clock, c.worker())

    told = [(kind, job, outcome) for kind, job, _, outcome in story(c, "s3_bucket:eu-west-1:logs")]
    assert told == [
        (ENQUEUED, first, None),
        (ATTEMPT, first, "error"),
        (ENQUEUED, second, None),
        (ATTEMPT, first, "completed"),  # after its backoff; the second waited behind it
        (ATTEMPT, second, "completed"),
    ]
    assert story(c, key) == story(c, "s3_bucket:eu-west-1:logs")


def test_history_of_a_target_no_job_touched_is_an_error_naming_it(c):
    with pytest.raises(UnknownTarget, match="notes/nothing.json"):
        c.history("notes/nothing.json")


def test_history_of_a_busy_target_shows_its_newest_jobs(c, clock):
    ids = [c.enqueue(Note(name=f"n{i}", target=TARGET)).id for i in range(4)]
    shown = c.history(TARGET, limit=2)
    assert [j.id for j in shown.jobs] == ids[2:] and shown.more
    assert not c.history(TARGET, limit=4).more


def test_the_history_command_prints_each_attempt_and_the_same_as_json(c, clock, db_url, monkeypatch, capsys):
    job_id = c.enqueue(Note(name="a", target=TARGET, fail_times=1)).id
    drain(c, clock, c.worker())

    code, text = run_main(monkeypatch, capsys, "--db", db_url, "history", "notes/a.json")
    assert code == 0, text
    assert "RuntimeError: a failed on run 1" in text and "completed" in text and job_id in text

    code, text = run_main(monkeypatch, capsys, "--db", db_url, "history", "notes/a.json", "--json")
    assert code == 0, text
    data = orjson.loads(text)
    assert data["key"] == TARGET and data["target"] == "notes/a.json" and data["jobs"] == [job_id]
    assert [(e["kind"], e["attempt"], e["outcome"]) for e in data["entries"]] == [
        (ENQUEUED, None, None),
        (ATTEMPT, 1, "error"),
        (ATTEMPT, 2, "completed"),
    ]

    code, text = run_main(monkeypatch, capsys, "--db", db_url, "history", "notes/missing.json")
    assert code == 1 and "no job has touched the target 'notes/missing.json'" in text
    assert "Traceback" not in text


# -- retention ---------------------------------------------------------------------------------


def test_purge_takes_the_attempts_of_the_jobs_it_deletes_and_keeps_the_latest_jobs_with_theirs(c, clock):
    old = c.enqueue(Note(name="old", target=TARGET, fail_times=1)).id
    drain(c, clock, c.worker())
    latest = c.enqueue(Note(name="latest", target=TARGET, fail_times=1)).id
    gone = c.enqueue(Note(name="gone", fail_times=1), max_attempts=1).id  # fails: its attempt is a row
    drain(c, clock, c.worker())
    c.startup_check()  # a reconcile run, which purge leaves to its own bound
    with c.engine.connect() as conn:
        runs = conn.execute(sa.text("SELECT count(*) FROM tether_reconcile_runs")).scalar_one()
    assert {job for job, _, _ in attempt_rows(c)} == {old, latest, gone}

    clock.advance(days=30)
    result = c.purge(older_than=timedelta(days=7), statuses=("completed", "failed"))

    assert result.total == 2
    assert attempt_rows(c) == [(latest, 1, "error")]
    assert [e.job_id for e in c.history(TARGET).entries] == [latest] * 3
    with c.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM tether_reconcile_runs")).scalar_one() == runs >= 1
