"""Job statuses: the values of the ``status`` column (the edges between them: lifecycle.py)."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "pending"
    """Waiting to be claimed once ``run_at`` has passed."""
    CLAIMED = "claimed"
    """Held by one worker (``locked_by``) for one attempt; its lock is renewed by heartbeats."""
    COMPLETED = "completed"
    """The handler returned; terminal."""
    FAILED = "failed"
    """Attempts exhausted, permanent error or invalid payload; only an operator retries it."""
    CANCELLED = "cancelled"
    """An operator cancelled it: before it ran, or while it ran (its effect's verdict is kept);
    terminal, never retried."""


# The statuses of a job that is still to run: its idempotency key and its target are taken.
ACTIVE = (JobStatus.PENDING, JobStatus.CLAIMED)
