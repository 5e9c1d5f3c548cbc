"""Job statuses and the only transitions between them (drawn in docs/lifecycle.md)."""

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


ACTIVE = (JobStatus.PENDING, JobStatus.CLAIMED)

# edge name -> (from, to). Every status change in tether is one of these edges.
TRANSITIONS: dict[str, tuple[JobStatus, JobStatus]] = {
    "claim": (JobStatus.PENDING, JobStatus.CLAIMED),
    "complete": (JobStatus.CLAIMED, JobStatus.COMPLETED),
    "retry": (JobStatus.CLAIMED, JobStatus.PENDING),
    "fail": (JobStatus.CLAIMED, JobStatus.FAILED),
    "reclaim": (JobStatus.CLAIMED, JobStatus.PENDING),
    "reclaim_exhausted": (JobStatus.CLAIMED, JobStatus.FAILED),
    "release": (JobStatus.CLAIMED, JobStatus.PENDING),
    "defer": (JobStatus.CLAIMED, JobStatus.PENDING),
    "snooze": (JobStatus.CLAIMED, JobStatus.PENDING),
    "manual_retry": (JobStatus.FAILED, JobStatus.PENDING),
}

# Edges that leave ``claimed`` on behalf of the worker holding the job: fenced by owner and attempt.
FENCED = frozenset({"complete", "retry", "fail", "release", "defer", "snooze"})
# Edges the stale-lock sweep takes for a dead worker: fenced on its owner and attempt as above,
# and on the lock still being stale.
SWEPT = frozenset({"reclaim", "reclaim_exhausted"})
# Edges that take a job out of the active set: the next job on its target may run now.
ENDING = frozenset(edge for edge, (_, to) in TRANSITIONS.items() if to not in ACTIVE)
