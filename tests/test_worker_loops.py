"""The worker's own loops, run as they run in production (not one tick called by hand): its
heartbeat renews a running job's lock by itself, and its database-error backoff starts again
after a success."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any, ClassVar

import orjson
import sqlalchemy as sa

from jobkit import Note, NoteType, registry_with
from tether import JobContext, JobStatus, JobType, Payload, SystemClock


class Watch(Payload):
    job_type: ClassVar[str] = "watch"


class WatchType(JobType[Watch]):
    """Waits (bounded) until the ledger shows its own lock renewed after the claim."""

    name = "watch"
    payload_model = Watch

    def __init__(self) -> None:
        self.coordinator: Any = None
        self.renewed: datetime | None = None

    def run(self, payload: Watch, ctx: JobContext) -> None:
        claimed_at = ctx.job.claimed_at
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            locked_at = self.coordinator.get(ctx.job.id).locked_at
            if claimed_at is not None and locked_at is not None and locked_at > claimed_at:
                self.renewed = locked_at
                return
            ctx.cancelled.wait(0.02)  # polling the ledger, bounded by the deadline


def test_the_worker_renews_a_running_jobs_lock_by_itself(make_coordinator):
    watch = WatchType()
    registry = registry_with()
    registry.register(watch)
    c = make_coordinator(registry, clock=SystemClock())  # the heartbeat stamps real time
    watch.coordinator = c
    job_id = c.enqueue(Watch()).id
    c.worker(lock_timeout=4, heartbeat_interval=0.05).run_until_idle()
    assert c.get(job_id).status is JobStatus.COMPLETED
    assert watch.renewed is not None, "no heartbeat renewed the lock while the job ran"


class _Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(record.getMessage()))


def test_the_database_error_backoff_starts_again_after_a_success(make_coordinator, monkeypatch):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue(Note(name="a"))
    real_claim = c.queue.claim
    script = ["fail", "fail", "ok", "fail"]  # then ok for ever
    lock = threading.Lock()

    def flaky_claim(*args: Any, **kwargs: Any) -> Any:
        with lock:
            step = script.pop(0) if script else "ok"
        if step == "fail":
            raise sa.exc.OperationalError("claim", {}, Exception("database is locked"))
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(c.queue, "claim", flaky_claim)
    events = _Events()
    logger = logging.getLogger("tether.events")
    logger.addHandler(events)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        c.worker(poll_interval=0.01, max_db_backoff=0.08).run_until_idle()
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)
    waits = [e["retry_in"] for e in events.lines if e["event"] == "db_error"]
    # 0.01, then doubled; the claim that ran the job resets it, so the next error waits 0.01 again.
    assert waits == [0.01, 0.02, 0.01]
    assert notes.seen == {"a": 1}
