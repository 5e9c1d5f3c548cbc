"""The job lifecycle: every edge between statuses with the event it logs (drawn in
docs/lifecycle.md), the ``Decision`` a worker records for a finished attempt, and how that
attempt's result or error is stored.

Each edge's event is the edge in the past tense (``retry`` logs ``retried``), so a log reader
who knows the edges knows the events; tests/test_docs.py keeps the docs and this table agreeing.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from ..errors import PermanentError, TetherError
from .attempts import Outcome
from .record import JobRecord, make_tuple
from .status import ACTIVE, JobStatus

_P, _C, _D, _F = JobStatus.PENDING, JobStatus.CLAIMED, JobStatus.COMPLETED, JobStatus.FAILED
_X = JobStatus.CANCELLED

# Who may take an edge, which the guarded UPDATE checks (see FENCED and SWEPT below).
OWNER = "owner"
SWEEP = "sweep"


class Edge(NamedTuple):
    """One allowed status change."""

    source: JobStatus
    target: JobStatus
    event: str
    """The event logged when a job takes this edge: the edge's name in the past tense."""
    fence: str | None = None
    """OWNER: only the worker holding the job for this attempt takes it; SWEEP: the stale-lock
    sweep takes it for a dead worker, fenced on that worker, its attempt and the stale lock."""
    attempt: Outcome | None = None
    """The attempt row this edge writes with the change (attempts.py): how the attempt ended, or
    for an operator's retry, that it happened. None: the job row tells it (a claim, a completion)."""


# Every status change in tether is one of these edges.
EDGES: dict[str, Edge] = {
    "claim": Edge(_P, _C, "claimed"),
    "complete": Edge(_C, _D, "completed", OWNER),
    "retry": Edge(_C, _P, "retried", OWNER, Outcome.ERROR),
    "fail": Edge(_C, _F, "failed", OWNER, Outcome.ERROR),
    "reclaim": Edge(_C, _P, "reclaimed", SWEEP, Outcome.RECLAIMED),
    "reclaim_exhausted": Edge(_C, _F, "reclaimed_exhausted", SWEEP, Outcome.RECLAIMED),
    "release": Edge(_C, _P, "released", OWNER, Outcome.GIVEN_BACK),
    "defer": Edge(_C, _P, "deferred", OWNER, Outcome.GIVEN_BACK),
    "snooze": Edge(_C, _P, "snoozed", OWNER, Outcome.GIVEN_BACK),
    "manual_retry": Edge(_F, _P, "manually_retried", attempt=Outcome.MANUAL_RETRY),
    "cancel": Edge(_P, _X, "cancelled"),
    "cancel_running": Edge(_C, _X, "cancelled_running", OWNER, Outcome.CANCELLED),
}

# Edges that leave ``claimed`` on behalf of the worker holding the job: fenced by owner and attempt.
FENCED = frozenset(name for name, edge in EDGES.items() if edge.fence == OWNER)
# Edges the stale-lock sweep takes for a dead worker: fenced on its owner and attempt as above,
# and on the lock still being stale.
SWEPT = frozenset(name for name, edge in EDGES.items() if edge.fence == SWEEP)
# Edges that take a job out of the active set: the next job on its target may run now.
ENDING = frozenset(name for name, edge in EDGES.items() if edge.target not in ACTIVE)
# Edges that give the attempt back: the job goes back to pending as if it had not been claimed.
GIVEN_BACK = frozenset({"release", "defer", "snooze"})


class Decision(NamedTuple):
    """What to record for one finished attempt: a fenced edge out of ``claimed`` and its values
    (one per job a worker runs: a NamedTuple, as cheap to build as JobRecord). The worker's
    completer (worker/completer.py) is the one place that builds them."""

    job: JobRecord
    edge: str  # one of FENCED
    values: dict[str, Any]
    children: Sequence[JobRecord] = ()
    duration: float | None = None
    finished_at: datetime | None = None  # when the handler returned (not when the group committed)
    outcome: Outcome | None = None  # the attempt's, where the edge does not tell it (a timeout)
    ran: bool = True  # False: the handler never started, so there is no attempt to record
    traceparent: str | None = None  # the attempt's span, kept with its attempt row (tether.tracing)

    def after(self) -> JobRecord:
        """The job as this decision leaves it (for its event, when the row was not read back)."""
        attempts = self.job.attempts - 1 if self.edge in GIVEN_BACK else self.job.attempts
        return self.job._replace(
            attempts=attempts,
            snoozes=self.job.snoozes + self.values.get("snoozed", 0),
            run_at=self.values.get("run_at", self.job.run_at),
            last_error=self.values.get("error", self.job.last_error),
        )

    @property
    def attempt(self) -> Outcome | None:
        """How the attempt ended, as its row records it; None: the job row tells it."""
        edge = EDGES[self.edge].attempt
        return None if edge is None or not self.ran else self.outcome or edge

    @classmethod
    def complete(
        cls,
        job: JobRecord,
        result: str | None,
        children: Sequence[JobRecord],
        duration: float | None,
        finished_at: datetime | None,
    ) -> Decision:
        """The handler returned ``result`` (stored JSON) and its follow-up jobs. Built by
        ``make_tuple`` with every field in order, as one per job is: a NamedTuple's own
        ``__new__`` is a Python frame with its defaults to fill."""
        return make_tuple(cls, (job, "complete", {"result": result}, children, duration, finished_at, None, True, None))

    @classmethod
    def retry(
        cls,
        job: JobRecord,
        error: str,
        run_at: datetime,
        duration: float | None = None,
        finished_at: datetime | None = None,
        outcome: Outcome | None = None,
    ) -> Decision:
        return cls(job, "retry", {"error": error, "run_at": run_at}, (), duration, finished_at, outcome)

    @classmethod
    def fail(
        cls,
        job: JobRecord,
        error: str,
        duration: float | None = None,
        finished_at: datetime | None = None,
        outcome: Outcome | None = None,
    ) -> Decision:
        return cls(job, "fail", {"error": error}, (), duration, finished_at, outcome)

    @classmethod
    def release(cls, job: JobRecord, duration: float | None = None, *, ran: bool = True) -> Decision:
        """Given back (cancelled at shutdown), or, with ``ran`` false, given back before its
        handler started (shutdown, a batch that turned slow): the attempt is not counted, and one
        that never started is no attempt at all (no attempt row)."""
        return cls(job, "release", {}, duration=duration, ran=ran)

    @classmethod
    def cancel_running(
        cls, job: JobRecord, error: str, effect: str, duration: float | None = None, finished_at: datetime | None = None
    ) -> Decision:
        """An operator cancelled the job while it ran: it ends ``cancelled`` with the verdict of
        whether its effect landed (``landed``, ``absent``, ``unknown``); its follow-up jobs are
        dropped."""
        result = orjson.dumps({"effect": effect}).decode()
        return cls(
            job, "cancel_running", {"error": error, "result": result}, duration=duration, finished_at=finished_at
        )

    @classmethod
    def defer(cls, job: JobRecord, error: str, run_at: datetime, duration: float | None = None) -> Decision:
        """Given back until ``run_at`` (a rate limit's reset, a snooze of scope "type"), with every
        pending job of its type: the attempt is not counted, the snooze is."""
        return cls(job, "defer", {"error": error, "run_at": run_at, "snoozed": 1}, duration=duration)

    @classmethod
    def snooze(
        cls, job: JobRecord, error: str, run_at: datetime, duration: float | None = None, *, counted: bool = True
    ) -> Decision:
        """Given back until ``run_at`` (a handler's snooze; a full data root, not ``counted``
        against the cap: a condition of the storage, not of the job): the attempt is not counted,
        and the type's other jobs are not held back."""
        return cls(job, "snooze", {"error": error, "run_at": run_at, "snoozed": int(counted)}, duration=duration)


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
