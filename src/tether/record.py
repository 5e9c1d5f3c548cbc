"""Jobs as read back from the ledger: plain, immutable, cheap to build on the hot path."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import orjson

from .status import JobStatus


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One row of ``tether_jobs``."""

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

    @classmethod
    def from_row(cls, row: Any) -> JobRecord:
        values = tuple(row)
        return cls(*values[:3], JobStatus(values[3]), *values[4:])

    @property
    def payload_data(self) -> dict[str, Any]:
        return orjson.loads(self.payload)

    @property
    def result_data(self) -> Any:
        return None if self.result is None else orjson.loads(self.result)

    def to_dict(self, *, include_payload: bool = False) -> dict[str, Any]:
        """JSON-ready form; the payload (which may hold file bodies, prompts) only on request."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "payload":
                if include_payload:
                    out["payload"] = self.payload_data
                continue
            if f.name == "result":
                value = self.result_data
            elif isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, JobStatus):
                value = value.value
            out[f.name] = value
        return out


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What ``enqueue`` did: ``duplicate`` is true when an active job with the same type and
    idempotency key already existed and was returned instead of a new one."""

    job: JobRecord
    duplicate: bool = False

    @property
    def id(self) -> str:
        return self.job.id
