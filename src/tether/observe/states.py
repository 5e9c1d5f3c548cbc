"""A job's state as an operator reads it: its status, with a pending job told by when it may run
and a claimed one by whether its worker still beats.

- ready: pending and due (``run_at`` passed), whether or not it waits behind an older job on its
  target;
- scheduled: pending, not due, never tried (enqueued with a delay, or a schedule's slot);
- retrying: pending, not due, tried before: waiting out a retry's backoff (a manual retry
  resets the attempts, so a retried job is ready or scheduled, never retrying);
- running: claimed, its lock renewed within the lock timeout;
- stuck: claimed, its lock older than the lock timeout (its worker died or hangs).

Each is one condition on a row (``condition``, for the jobs page's filter and the overview's
counts) and one test of a ``JobRecord`` (``state_of``, for a listing's badge).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..ledger.record import JobRecord
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus

PENDING_STATES = ("ready", "scheduled", "retrying")
CLAIMED_STATES = ("running", "stuck")
STATES = PENDING_STATES + CLAIMED_STATES


def condition(state: str, now: datetime, cutoff: datetime) -> sa.ColumnElement[bool]:
    """The rows in ``state`` at ``now``; ``cutoff``: the lock time before which a claim is stuck."""
    t = jobs_table.c
    later = t.run_at > now
    conditions: dict[str, Any] = {
        "ready": sa.and_(t.status == JobStatus.PENDING.value, t.run_at <= now),
        "scheduled": sa.and_(t.status == JobStatus.PENDING.value, later, t.attempts == 0),
        "retrying": sa.and_(t.status == JobStatus.PENDING.value, later, t.attempts > 0),
        "running": sa.and_(t.status == JobStatus.CLAIMED.value, t.locked_at >= cutoff),
        "stuck": sa.and_(t.status == JobStatus.CLAIMED.value, t.locked_at < cutoff),
    }
    return conditions[state]  # type: ignore[no-any-return]


def state_of(job: JobRecord, now: datetime, cutoff: datetime) -> str:
    """``job``'s state at ``now``: one of STATES, or its status once it has finished."""
    if job.status is JobStatus.PENDING:
        if job.run_at <= now:
            return "ready"
        return "retrying" if job.attempts > 0 else "scheduled"
    if job.status is JobStatus.CLAIMED:
        return "stuck" if job.locked_at is not None and job.locked_at < cutoff else "running"
    return job.status.value
