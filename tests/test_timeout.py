"""A job type's timeout (or a job's own) bounds an attempt; cancellation reaches the handler."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

from tether import JobStatus, JobType, Payload
from tether.jobtypes import default_registry


class Nap(Payload):
    job_type: ClassVar[str] = "nap"
    seconds: float
    cooperative: bool = True


class NapType(JobType[Nap]):
    name = "nap"
    payload_model = Nap
    timeout = 0.2

    def __init__(self) -> None:
        self.seen: list[threading.Event] = []
        self.finished = threading.Event()

    def run(self, payload: Nap, ctx):  # noqa: ANN001, ANN201
        self.seen.append(ctx.cancelled)
        if payload.cooperative:
            ctx.cancelled.wait(payload.seconds)
        else:
            threading.Event().wait(payload.seconds)  # ignores cancellation
        self.finished.set()
        return {"slept": payload.seconds}


@pytest.fixture
def napping(make_coordinator):
    nap = NapType()
    registry = default_registry()
    registry.register(nap)
    return make_coordinator(registry=registry), nap


def test_a_handler_past_its_timeout_is_recorded_as_a_retryable_timeout_and_its_cancellation_is_set(napping):
    c, nap = napping
    job = c.enqueue(Nap(seconds=30), max_attempts=2).id
    assert c.run_until_idle() == 1
    after = c.get(job)
    assert after.status is JobStatus.PENDING and after.attempts == 1
    assert after.last_error.startswith("JobTimedOut: nap job") and "timeout of 0.2s" in after.last_error
    [cancelled] = nap.seen
    assert cancelled.is_set()
    assert nap.finished.wait(5)  # the cooperative handler stopped when told


def test_a_handler_that_ignores_its_timeout_does_not_hold_the_worker(napping):
    c, nap = napping
    job = c.enqueue(Nap(seconds=2, cooperative=False), max_attempts=1).id
    c.run_until_idle()
    assert c.get(job).status is JobStatus.FAILED  # recorded while the handler still sleeps
    assert not nap.finished.is_set() and nap.seen[0].is_set()


def test_the_timeout_given_at_enqueue_overrides_the_types(napping):
    c, nap = napping
    job = c.enqueue(Nap(seconds=0.5), timeout=10).id
    c.run_until_idle()
    assert c.get(job).status is JobStatus.COMPLETED
    assert c.get(job).result_data == {"slept": 0.5}


def test_a_timeout_must_be_a_positive_number(napping):
    from tether import InvalidPayload

    c, _ = napping
    for bad in (0, -1, float("nan"), float("inf"), "5", True):
        with pytest.raises(InvalidPayload, match="timeout: must be a number of seconds > 0"):
            c.enqueue(Nap(seconds=1), timeout=bad)


def test_shutdown_and_lost_leases_set_the_running_jobs_cancellation(make_coordinator):
    from tether import CreateFile
    from tether.jobtypes.context import LEASE_LOST, SHUTDOWN

    c = make_coordinator()
    c.enqueue(CreateFile(path="a.json", content=1))
    c.enqueue(CreateFile(path="b.json", content=1))
    w = c.worker()
    first, second = c.queue.claim(w.id, limit=2)
    ctx1, ctx2 = w.executor.start([first, second])  # running, as a batch's jobs are
    event = ctx1.cancelled  # asked for before the cancellation
    c.clock.advance(c.lock_timeout + 1)
    c.queue.heartbeat(w.id, [first])  # the first stays fresh
    c.reclaim_stale()  # the second's lock is taken from this worker...
    c.queue.claim("other")
    w.heartbeat_once()  # ...which the heartbeat finds
    assert ctx2.cancel_reason == LEASE_LOST and ctx2.cancelled.is_set()
    assert not event.is_set()
    w.stop(cancel=True)
    assert event.is_set() and ctx1.cancel_reason == SHUTDOWN
