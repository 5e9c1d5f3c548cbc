"""Jobs as read back from the ledger: plain, immutable, cheap to build on the hot path.

Both are NamedTuples rather than frozen dataclasses: a frozen dataclass sets each field through
``object.__setattr__``, several times the cost of a tuple, on a path that builds one per job
(benchmarks/README.md, "Figures behind the code").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from .status import JobStatus

make_tuple = tuple.__new__
"""``make_tuple(JobRecord, values)``: ``JobRecord._make(values)`` without its Python frame. The
enqueue and claim paths build one per job, where each frame costs a few microseconds of cold
cache after a commit's fsync."""


class JobRecord(NamedTuple):
    """One row of ``tether_jobs``. ``job._replace(field=value)`` makes a changed copy."""

    id: str
    type: str
    payload: str
    status: JobStatus
    priority: int
    attempts: int
    max_attempts: int
    last_error: str | None
    locked_by: str | None
    locked_at: datetime | None
    created_at: datetime
    claimed_at: datetime | None
    completed_at: datetime | None
    run_at: datetime
    idempotency_key: str | None
    ordering_key: str | None
    parent_id: str | None
    result: str | None
    timeout: float | None = None
    progress: str | None = None
    quarantine: str | None = None  # why it is claimed alone (a dead worker held it); see reclaim.py
    payload_bytes: int | None = None  # len of the payload's UTF-8; None for a job enqueued before it was kept
    snoozes: int = 0  # times the job snoozed, its attempt given back (WorkerConfig.max_snoozes caps it)
    traceparent: str | None = None  # the W3C trace context current at its enqueue (tether.tracing)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> JobRecord:
        """The job of one row whose times are datetimes already (as SQLAlchemy reads them)."""
        return from_rows([row])[0]

    @property
    def first_run(self) -> bool:
        """No earlier attempt of this job can have started: it is on its first counted attempt and
        was never given an attempt back (a dead worker's batch, reclaim.py; a deferral) nor failed
        before a manual retry (both leave ``quarantine`` or ``last_error``)."""
        return self.attempts <= 1 and self.quarantine is None and self.last_error is None

    @property
    def payload_data(self) -> dict[str, Any]:
        data: dict[str, Any] = orjson.loads(self.payload)  # always an object: payloads are models
        return data

    @property
    def result_data(self) -> Any:
        return None if self.result is None else orjson.loads(self.result)

    def to_dict(self, *, include_payload: bool = False) -> dict[str, Any]:
        """JSON-ready form; the payload (which may hold file bodies, prompts) only on request."""
        out: dict[str, Any] = {}
        for name, value in zip(self._fields, self, strict=True):
            if name == "payload":
                if include_payload:
                    out["payload"] = self.payload_data
                continue
            if name in ("result", "progress"):
                value = None if value is None else orjson.loads(str(value))
            elif isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, JobStatus):
                value = value.value
            out[name] = value
        return out


_STATUS = {s.value: s for s in JobStatus}
_TIMES = tuple(
    JobRecord._fields.index(name) for name in ("locked_at", "created_at", "claimed_at", "completed_at", "run_at")
)


def from_rows(rows: Iterable[Sequence[Any]], read_time: Callable[[Any], datetime] | None = None) -> list[JobRecord]:
    """The jobs of ``rows`` (the columns of ``schema.RECORD_COLUMNS``, in order): the one place a
    row becomes a JobRecord. ``read_time`` reads a stored time where the driver gives it as the
    ledger keeps it (SQLite's text); a claimed batch shares its claim time and each job its
    created and run times, so each distinct one is read once."""
    times: dict[Any, datetime] = {}
    out = []
    for row in rows:
        values = list(row)
        values[3] = _STATUS[values[3]]
        if read_time is not None:
            for i in _TIMES:
                stored = values[i]
                if stored is not None:
                    when = times.get(stored)
                    if when is None:
                        when = times[stored] = read_time(stored)
                    values[i] = when
        out.append(make_tuple(JobRecord, values))  # JobRecord(*values) without its Python frame
    return out


class InsertResult(NamedTuple):
    """What ``enqueue`` did: ``duplicate`` is true when an active job with the same type and
    idempotency key already existed and was returned instead of a new one."""

    job: JobRecord
    duplicate: bool = False

    @property
    def id(self) -> str:
        return self.job.id
