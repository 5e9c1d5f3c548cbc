"""When a worker dies, only the job it was running is blamed (issue 22; tether/ledger/reclaim.py), on
SQLite and PostgreSQL. Claims and sweeps are driven by hand at fixed times; the real-process
reproduction is tests/test_poison.py."""

from __future__ import annotations

import pytest

from jobkit import Note, NoteType, completed, registry_with
from tether import JobStatus


@pytest.fixture
def c(make_coordinator):
    return make_coordinator(registry_with(NoteType()))


def die(c, clock) -> list:
    """The worker holding jobs dies: its locks go stale and the sweep runs."""
    clock.advance(c.lock_timeout + 1)
    return c.reclaim_stale()


def test_a_dead_workers_batch_comes_back_with_its_attempts_and_quarantined(c, clock):
    ids = [r.id for r in c.enqueue_many([Note(name=str(i)) for i in range(3)])]
    assert len(c.queue.claim("w1", limit=10)) == 3
    back = die(c, clock)
    assert sorted(j.id for j in back) == sorted(ids)
    for job in map(c.get, ids):
        assert (job.status, job.attempts) == (JobStatus.PENDING, 0)
        assert job.quarantine.startswith("suspect:w1 ")
        assert job.last_error.startswith("worker died while running a batch of 3 jobs holding this one")


def test_a_job_that_ran_alone_keeps_its_attempt_and_is_quarantined(c, clock):
    job_id = c.enqueue(Note(name="a")).id
    c.queue.claim("w1", limit=10)
    [back] = die(c, clock)
    assert (back.id, back.status, back.attempts, back.quarantine) == (job_id, JobStatus.PENDING, 1, "crashed")
    assert back.last_error.startswith("worker died while running (reclaimed, attempt 1 of 3): lock of worker w1")


def test_two_threads_of_one_worker_claiming_in_the_same_microsecond_are_two_claims(c, clock):
    a, b = (c.enqueue(Note(name=n)).id for n in "ab")
    # One worker id, the clock frozen: as two threads of a worker that read the clock at once.
    [first], [second] = c.queue.claim("w1", limit=1), c.queue.claim("w1", limit=1)
    assert first.claimed_at != second.claimed_at
    back = die(c, clock)
    # Each ran alone: each keeps its attempt, quarantined as the one that was running.
    assert sorted((j.id, j.attempts, j.quarantine) for j in back) == sorted([(a, 1, "crashed"), (b, 1, "crashed")])


def test_the_last_job_of_a_batch_without_an_outcome_is_the_one_that_was_running(c, clock):
    c.enqueue_many([Note(name=n) for n in "abd"])
    a, b, d = c.queue.claim("w1", limit=10)
    c.queue.finish_and_claim("w1", [completed(a, None), completed(b, None)])  # a group commit
    [back] = die(c, clock)
    assert (back.id, back.attempts, back.quarantine) == (d.id, 1, "crashed")


def test_a_quarantined_job_is_claimed_alone_when_it_is_first_and_never_in_a_batch(c, clock):
    a, b, d, e = (c.enqueue(Note(name=n)).id for n in "abde")
    c.queue.claim("w1", limit=2)  # a and b
    die(c, clock)
    urgent = c.enqueue(Note(name="urgent"), priority=5).id
    # First in line is a job that is not quarantined: a batch of those, without a and b.
    assert [j.id for j in c.queue.claim("w2", limit=10)] == [urgent, d, e]
    assert [j.id for j in c.queue.claim("w2", limit=10)] == [a]
    assert [j.id for j in c.queue.claim("w2", limit=10)] == [b]
    assert c.queue.claim("w2", limit=10) == []


def test_a_suspect_that_kills_its_worker_alone_is_charged_the_batch_crash_and_its_mates_are_acquitted(c, clock):
    a, b, d = (c.enqueue(Note(name=n)).id for n in "abd")
    c.queue.claim("w1", limit=10)
    die(c, clock)  # the batch crash: nobody can be blamed yet
    [ja] = c.queue.claim("w2", limit=10)
    c.queue.finish_and_claim("w2", [completed(ja, None)])
    assert c.queue.claim("w3", limit=10)[0].id == b
    die(c, clock)  # b killed w3 while running alone
    jb = c.get(b)
    assert (jb.status, jb.attempts, jb.quarantine) == (JobStatus.PENDING, 2, "crashed")
    assert jb.last_error.startswith("worker died while running (reclaimed, attempt 2 of 3)")
    assert (c.get(a).attempts, c.get(d).quarantine) == (1, "suspect")  # a lost nothing; d owes nothing
    assert c.queue.claim("w4", limit=10)[0].id == b
    die(c, clock)
    jb = c.get(b)
    assert (jb.status, jb.attempts) == (JobStatus.FAILED, 3)
    assert jb.last_error.startswith("worker died while running (reclaimed, attempt 3 of 3; no attempts left)")
    [jd] = c.queue.claim("w5", limit=10)
    die(c, clock)  # d kills a worker alone too: only its own crash counts
    assert (jd.id, c.get(d).attempts, c.get(d).status) == (d, 1, JobStatus.PENDING)


def test_a_job_on_its_last_attempt_is_claimed_alone_and_its_crash_fails_it_at_once(c, clock):
    x = c.enqueue(Note(name="x")).id
    last = c.enqueue(Note(name="last"), max_attempts=1).id
    z = c.enqueue(Note(name="z")).id
    batch = c.queue.claim("w1", limit=10)
    assert [j.id for j in batch] == [x, z]  # never in a batch
    for job in batch:
        c.queue.finish_and_claim("w1", [completed(job, None)])
    [alone] = c.queue.claim("w2", limit=10)
    assert alone.id == last
    [failed] = die(c, clock)
    assert (failed.id, failed.status, failed.attempts) == (last, JobStatus.FAILED, 1)
    assert failed.last_error.startswith("worker died while running (reclaimed, attempt 1 of 1; no attempts left)")


def test_status_counts_quarantined_jobs_and_a_manual_retry_lifts_the_quarantine(c, clock):
    job_id = c.enqueue(Note(name="a"), max_attempts=1).id
    c.enqueue(Note(name="b"))
    c.queue.claim("w1", limit=1)
    die(c, clock)
    assert c.get(job_id).status is JobStatus.FAILED
    c.queue.claim("w1", limit=1)
    die(c, clock)
    assert c.stats().quarantined == 1  # b, pending; a failed and is no longer counted
    retried = c.retry(job_id)
    assert (retried.status, retried.attempts, retried.quarantine) == (JobStatus.PENDING, 0, None)
