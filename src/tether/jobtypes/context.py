"""What a handler receives besides its payload: the job, the data root, the clock, follow-up
jobs, the lease, and its cancellation."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ..clock import Clock, elapsed
from ..errors import Cancelled
from ..ledger.record import JobRecord

if TYPE_CHECKING:
    from . import Payload
    from .datafiles.dirsync import DirSyncs

TIMEOUT = "timeout"
SHUTDOWN = "shutdown"
LEASE_LOST = "lease_lost"
CANCELLED = "cancelled"  # an operator cancelled the job (``tether cancel``): ``cancel_note`` says why

PROGRESS_EVERY = 1.0
"""Seconds between two writes of one job's progress."""

_MESSAGES = {
    TIMEOUT: "ran past its timeout",
    SHUTDOWN: "cancelled at shutdown",
    LEASE_LOST: "lost its lock to another worker",
    CANCELLED: "was cancelled by an operator",
}

# Creating a context's Event lazily: most handlers never ask for it, and a threading.Event (a
# Condition and its lock) per job is a visible share of a fast job's cost.
_EVENT_LOCK = threading.Lock()


class Services(Protocol):
    """The little of the ledger a handler may use (the worker's queue provides it)."""

    root: Path
    clock: Clock
    ledger_id: str

    def build(self, payload: Payload, **options: Any) -> JobRecord: ...

    def holds(self, job: JobRecord, worker: str) -> bool: ...

    def record_progress(self, job: JobRecord, worker: str, progress: str) -> bool: ...


class JobContext:
    """The running job and what its handler may do besides its effect.

    ``cancelled`` is set, with ``cancel_reason``, when the handler should stop: its timeout
    passed (``timeout``), the worker is shutting down hard (``shutdown``), this worker lost
    the job's lock (``lease_lost``), or an operator cancelled the job (``cancelled``, their
    reason in ``cancel_note``). A handler that waits (a subprocess, a network call) waits
    on it; ``checkpoint()`` raises Cancelled once it is set."""

    # Slots, and the follow-up list made on the first ``enqueue``: a worker keeps a batch's
    # contexts alive until the batch's group commit, and each object the garbage collector
    # tracks there counts towards its next collection (benchmarks/README.md).
    __slots__ = (
        "job",
        "worker",
        "root",
        "clock",
        "ledger_id",
        "_children",
        "_services",
        "_progress",
        "_progress_written",
        "_shutdown",
        "_reason",
        "cancel_note",
        "_event",
        "_trusted_until",
        "dir_syncs",
    )

    def __init__(
        self,
        job: JobRecord,
        services: Services,
        shutdown: threading.Event | None = None,
        worker: str = "",
        *,
        trusted_until: float | None = None,
        dir_syncs: DirSyncs | None = None,
    ) -> None:
        self.job = job
        self.worker = worker
        self.root: Path = services.root
        self.clock: Clock = services.clock
        # What the ledger calls itself in the world (tether's ownership tag on AWS resources).
        self.ledger_id: str = services.ledger_id
        self._children: list[JobRecord] | None = None
        self._services = services  # not its bound methods: three more objects per job
        self._progress: dict[str, Any] | None = None
        self._progress_written = time.monotonic()  # a job's first second writes nothing
        self._shutdown = shutdown
        self._reason: str | None = None
        # The operator's reason, once an operator cancelled the job (reason ``cancelled``).
        self.cancel_note: str | None = None
        self._event: threading.Event | None = None
        # Until then (clock.elapsed()), the worker knows without asking that it holds the job.
        self._trusted_until = trusted_until
        # The worker's directory fsyncs owed before this job is recorded (``dirsync``); None: a
        # file helper fsyncs the directory itself.
        self.dir_syncs = dir_syncs

    @property
    def children(self) -> list[JobRecord]:
        """The follow-up jobs queued so far (``enqueue``)."""
        if self._children is None:
            self._children = []
        return self._children

    def followups(self) -> Sequence[JobRecord]:
        """``children`` without making an empty list for a job that queued none."""
        return self._children or ()

    # -- cancellation ------------------------------------------------------------------------

    def cancel(self, reason: str, note: str | None = None) -> None:
        """Ask the handler to stop (the worker calls this); the first reason is kept. An
        operator's cancel (``CANCELLED``, with its ``note``) is kept over any other: it decides
        how the attempt ends."""
        if self._reason is None or (reason == CANCELLED and self.cancel_note is None):
            self._reason = reason
        if reason == CANCELLED and self.cancel_note is None:
            self.cancel_note = note or "no reason given"
        event = self._event
        if event is not None:
            event.set()

    @property
    def cancel_reason(self) -> str | None:
        """``timeout``, ``shutdown``, ``lease_lost`` or ``cancelled`` (an operator's) once
        cancelled, else None."""
        if self._reason is None and self._shutdown is not None and self._shutdown.is_set():
            self.cancel(SHUTDOWN)
        return self._reason

    @property
    def cancelled(self) -> threading.Event:
        """An event set when the handler should stop: ``ctx.cancelled.wait(seconds)`` or
        ``ctx.cancelled.is_set()``."""
        event = self._event
        if event is None:
            with _EVENT_LOCK:
                if self._event is None:
                    self._event = threading.Event()
                    if self.cancel_reason is not None:
                        self._event.set()
                event = self._event
        elif not event.is_set() and self.cancel_reason is not None:
            event.set()
        return event

    def checkpoint(self) -> None:
        """A safe point to stop: raises Cancelled once the job is cancelled. At shutdown or after
        a lost lock the attempt is then given back; after a timeout it counts as failed."""
        reason = self.cancel_reason
        if reason is not None:
            raise Cancelled(f"job {self.job.id} {_MESSAGES.get(reason, reason)}")

    def confirm_lease(self) -> None:
        """Checkpoint, then ask the ledger whether this worker still holds the job. Handlers
        call it (under the target's lock) right before an effect that must not land late: a
        worker paused or cut off past its lock timeout then stops instead of overwriting the
        outcome of the job's new owner. Within half the lock timeout of the claim, on a ledger
        whose workers share one machine's clocks, the answer is known without asking."""
        self.checkpoint()
        if self._trusted_until is not None and elapsed() < self._trusted_until:
            return
        if self.worker and not self._services.holds(self.job, self.worker):
            self.cancel(LEASE_LOST)
            self.checkpoint()

    # -- progress ----------------------------------------------------------------------------

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Say how far the job has come (``tether jobs`` and ``show`` display it). Cheap to call
        often: it is written to the ledger at most once every PROGRESS_EVERY seconds, and never
        in a job's first such interval, so fast jobs never pay a write for it. ``note`` is for
        the operator (a phase, a count): never put payload contents in it."""
        self._progress = {"done": done, "total": total, "note": None if note is None else str(note)[:200]}
        now = time.monotonic()
        if now - self._progress_written < PROGRESS_EVERY or not self.worker:
            return
        self._progress_written = now
        self._progress["at"] = self.clock.now().isoformat()
        if not self._services.record_progress(self.job, self.worker, orjson.dumps(self._progress).decode()):
            self.cancel(LEASE_LOST)

    # -- follow-up jobs ----------------------------------------------------------------------

    def enqueue(
        self,
        payload: Payload,
        *,
        priority: int = 0,
        max_attempts: int = 3,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        key: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Queue a follow-up job. It is validated now and committed in the same transaction that
        completes this job, so it exists if and only if this job completed."""
        self.children.append(
            self._services.build(
                payload,
                priority=priority,
                max_attempts=max_attempts,
                delay=delay,
                run_at=run_at,
                key=key,
                timeout=timeout,
                parent_id=self.job.id,
            )
        )

    def __repr__(self) -> str:
        return f"JobContext(job={self.job.id!r}, type={self.job.type!r}, attempt={self.job.attempts})"
