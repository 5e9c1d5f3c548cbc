"""Jobs that finished: what completed, failed or was cancelled lately (``tether recent``), the failed jobs
(``tether failed``), and failures grouped by their error (the web page's)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..ledger.record import JobRecord
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .health import finished_statement
from .readonly import Source, done, now_of, reading, records, select_jobs

_FINISHED = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


@dataclass(frozen=True)
class Recent:
    """Jobs that finished (completed, failed or cancelled) in ``[since, until]``, newest first."""

    since: datetime
    until: datetime
    completed: int
    failed: int
    jobs: list[JobRecord]
    cancelled: int = 0


def recent(
    source: Source,
    *,
    since: datetime | timedelta = timedelta(hours=1),
    job_type: str | None = None,
    limit: int | None = 100,
    now: datetime | None = None,
) -> Recent:
    """What finished in the window: counts by outcome and the newest ``limit`` jobs."""
    until = now_of(source, now)
    if isinstance(since, timedelta):
        since = until - since
    with reading(source) as conn:
        counts = {status: n for status, n in conn.execute(finished_statement(since, until, job_type, _FINISHED))}
        listed = newest_finished(conn, _FINISHED, job_type, since, until, limit)
    return Recent(since, until, counts.get("completed", 0), counts.get("failed", 0), listed, counts.get("cancelled", 0))


def failed(
    source: Source, *, job_type: str | None = None, since: datetime | None = None, limit: int | None = 50
) -> list[JobRecord]:
    """Failed jobs, most recently failed first (``completed_at`` is when they failed)."""
    with reading(source) as conn:
        return newest_finished(conn, (JobStatus.FAILED,), job_type, since, None, limit)


def newest_finished(
    conn: sa.Connection,
    statuses: tuple[JobStatus, ...],
    job_type: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int | None,
) -> list[JobRecord]:
    """The newest ``limit`` jobs of the finished ``statuses``, by finish time."""
    # One walk of ix_tether_jobs_done per status, newest first, merged here: with ``status IN``
    # neither database can read that index in completed_at order across the statuses, so it
    # sorted the whole window before taking the newest few.
    newest = (jobs_table.c.completed_at.desc(), jobs_table.c.id.desc())
    found: list[JobRecord] = []
    for status in statuses:
        query = select_jobs().where(jobs_table.c.status == status.value, done())
        if since is not None:
            query = query.where(jobs_table.c.completed_at >= since)
        if until is not None:
            query = query.where(jobs_table.c.completed_at <= until)
        if job_type is not None:
            query = query.where(jobs_table.c.type == job_type)
        found += records(conn, query.order_by(*newest).limit(limit))
    if len(statuses) > 1:
        found.sort(key=lambda j: (j.completed_at, j.id), reverse=True)
    return found[:limit] if limit is not None else found


@dataclass(frozen=True)
class ErrorGroup:
    """Failed jobs that share an error message (``error_summary`` of their ``last_error``):
    how many, of which types, when the last of them failed, and the newest of them."""

    message: str
    count: int
    types: dict[str, int]
    last_failed_at: datetime
    newest_id: str


def error_summary(text: str | None) -> str:
    """The line that names an error: a traceback's last line (its exception), else the first."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return "(no error recorded)"
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


def failed_by_error(source: Source, *, job_type: str | None = None) -> list[ErrorGroup]:
    """Failed jobs grouped by error message, largest group first. The database groups the
    failed rows (through ``ix_tether_jobs_done``) by type and whole error text; only those
    groups are merged here by their summary line, so no job is built in Python."""
    query = (
        sa.select(
            jobs_table.c.type,
            jobs_table.c.last_error,
            sa.func.count(),
            sa.func.max(jobs_table.c.completed_at),
            sa.func.max(jobs_table.c.id),
        )
        .where(jobs_table.c.status == JobStatus.FAILED.value, done())
        .group_by(jobs_table.c.type, jobs_table.c.last_error)
    )
    if job_type is not None:
        query = query.where(jobs_table.c.type == job_type)
    merged: dict[str, dict[str, Any]] = {}
    with reading(source) as conn:
        for name, error, n, last_at, newest in conn.execute(query):
            group = merged.setdefault(error_summary(error), {"count": 0, "types": {}, "at": last_at, "id": newest})
            group["count"] += n
            group["types"][name] = group["types"].get(name, 0) + n
            group["at"], group["id"] = max(group["at"], last_at), max(group["id"], newest)
    out = [ErrorGroup(m, g["count"], dict(sorted(g["types"].items())), g["at"], g["id"]) for m, g in merged.items()]
    out.sort(key=lambda g: (-g.count, g.message))
    return out
