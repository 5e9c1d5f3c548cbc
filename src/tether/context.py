"""What a handler receives besides its payload."""

from __future__ import annotations

import threading
import time
import traceback
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from .errors import Cancelled, PermanentError, TetherError
from .record import JobRecord

if TYPE_CHECKING:
    from .jobtypes import Payload
    from .queue import NewJob, Queue


class _Flag:
    """Set once by the heartbeat thread, read by the handler's: a threading.Event without the
    condition variable nobody waits on (one per job on the hot path)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class JobContext:
    """The running job, the data root, shutdown checkpoints and follow-up jobs."""

    def __init__(
        self,
        job: JobRecord,
        queue: Queue,
        cancel: threading.Event,
        worker: str = "",
        *,
        trusted_until: float | None = None,
    ) -> None:
        self.job = job
        self.worker = worker
        self.root: Path = queue.root
        self.clock = queue.clock
        self._queue = queue
        self._cancel = cancel
        self.lease_lost = _Flag()
        self.children: list[NewJob] = []
        # Until then (time.monotonic()), the worker knows without asking that it holds the job.
        self._trusted_until = trusted_until

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set() or self.lease_lost.is_set()

    def checkpoint(self) -> None:
        """A safe point to stop: raises Cancelled when the worker is shutting down hard or this
        worker has lost the job's lock. The attempt is then given back."""
        if self._cancel.is_set():
            raise Cancelled(f"job {self.job.id} cancelled at shutdown")
        if self.lease_lost.is_set():
            raise Cancelled(f"job {self.job.id} lost its lock to another worker")

    def confirm_lease(self) -> None:
        """Checkpoint, then ask the ledger whether this worker still holds the job. Handlers
        call it (under the target's lock) right before an effect that must not land late: a
        worker paused or cut off past its lock timeout then stops instead of overwriting the
        outcome of the job's new owner. Within half the lock timeout of the claim the answer is
        known without asking."""
        self.checkpoint()
        if self._trusted_until is not None and time.monotonic() < self._trusted_until:
            return
        if self.worker and not self._queue.holds(self.job, self.worker):
            self.lease_lost.set()
            raise Cancelled(f"job {self.job.id} lost its lock to another worker")

    def enqueue(
        self,
        payload: Payload,
        *,
        priority: int = 0,
        max_attempts: int = 3,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        key: str | None = None,
    ) -> None:
        """Queue a follow-up job. It is validated now and committed in the same transaction that
        completes this job, so it exists if and only if this job completed."""
        self.children.append(
            self._queue.build(
                payload,
                priority=priority,
                max_attempts=max_attempts,
                delay=delay,
                run_at=run_at,
                key=key,
                parent_id=self.job.id,
            )
        )

    def __repr__(self) -> str:
        return f"JobContext(job={self.job.id!r}, type={self.job.type!r}, attempt={self.job.attempts})"


def error_text(exc: BaseException) -> str:
    """What goes into ``last_error``: ``ExceptionType: message`` first, which is the line that
    ``failed``, ``jobs``, ``recent`` and the events show; for an error that is not tether's own the
    traceback follows on the next lines, for ``tether show`` (NUL bytes written as \\0:
    PostgreSQL text cannot hold them)."""
    try:
        message = str(exc).strip()
    except Exception:  # an exception whose __str__ fails still gets its type on the first line
        message = "<message unavailable>"
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if isinstance(exc, TetherError):
        text = head
    else:
        text = head.split("\n", 1)[0] + "\n" + "".join(traceback.format_exception(exc, limit=20)).rstrip()
    return text.replace("\x00", "\\0")


def encode_result(job_type: str, result: Any) -> str | None:
    """A handler's result as stored JSON; one that cannot be encoded is the handler's error."""
    if result is None:
        return None
    try:
        return orjson.dumps(result).decode()
    except TypeError as e:
        raise PermanentError(f"{job_type} handler returned a result that is not JSON: {e}") from e
