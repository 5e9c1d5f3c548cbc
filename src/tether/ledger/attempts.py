"""Attempts: how each run of a job ended, kept so that a target's history can be told whole.

A job row tells only its latest attempt (``claimed_at``, ``completed_at``, ``last_error``); each
retry, reclaim or give-back overwrites it. So every transition that ends an attempt without
completing the job writes one row of ``tether_attempts`` in the transaction that records the
outcome (the worker's group commit, the stale-lock sweep): the row and the outcome commit
together or not at all.

The attempt that completes a job writes no row: the completed job row already holds it whole
(its attempt number, ``claimed_at`` as its start, ``completed_at`` as its end, and ``locked_by``,
which completion keeps as the worker that ran it). That is every job of a drain that nothing
went wrong in, so the hot path pays nothing for the log. A running job's attempt is its row too.

An operator's retry of a failed job is kept here as well (outcome ``manual_retry``): it is no
attempt, but it starts the job's count again, and the history says when.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from .record import JobRecord

ERROR_CHARS = 500
"""An attempt keeps the first line of its error, at most this long (the whole of the latest
error stays in the job's ``last_error``)."""


class Outcome(StrEnum):
    """How one attempt ended (the ``outcome`` column of ``tether_attempts``)."""

    COMPLETED = "completed"
    """The handler returned (told by the completed job row, never stored as an attempt row)."""
    ERROR = "error"
    """The handler raised: the job was retried or failed."""
    TIMEOUT = "timeout"
    """The attempt ran past its timeout and was cancelled."""
    RECLAIMED = "reclaimed"
    """Its worker died (its lock went stale) and the sweep took the job back."""
    GIVEN_BACK = "given_back"
    """The worker gave the attempt back uncounted: shutdown, a rate limit, a full data root."""
    CANCELLED = "cancelled"
    """An operator cancelled the job while it ran."""
    RUNNING = "running"
    """Not over yet (told by the claimed job row, never stored)."""
    MANUAL_RETRY = "manual_retry"
    """Not an attempt: an operator retried the failed job, starting its count again."""


# What a row of tether_attempts may hold: the outcomes the job row cannot tell.
STORED = tuple(o for o in Outcome if o not in (Outcome.COMPLETED, Outcome.RUNNING))


def first_line(error: str | None) -> str | None:
    """The line of ``error`` an attempt keeps."""
    if not error:
        return None
    return error.split("\n", 1)[0][:ERROR_CHARS]


def row(
    job: JobRecord,
    outcome: Outcome,
    ended_at: datetime,
    *,
    worker: str | None,
    error: str | None = None,
    started_at: datetime | None = None,
    traceparent: str | None = None,
) -> dict[str, Any]:
    """The values of INSERT_ATTEMPT for the attempt of ``job`` (as its claim read it) that ended
    at ``ended_at`` with ``outcome``; it started when its claim took the job. ``traceparent``: the
    attempt's span, when it was traced (tether.tracing)."""
    return {
        "job_id": job.id,
        "attempt": job.attempts,
        "started_at": started_at or job.claimed_at or ended_at,
        "ended_at": ended_at,
        "worker": worker,
        "outcome": outcome.value,
        "error": first_line(error),
        "traceparent": traceparent,
    }
