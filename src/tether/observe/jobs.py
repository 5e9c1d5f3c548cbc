"""Finding jobs: a filtered listing (``tether jobs``), one job by its id or a part of it
(``tether show``), the jobs a job enqueued, the jobs on one target, and counts over them all."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..errors import AmbiguousJobId, JobNotFound
from ..ledger import ids, pausing
from ..ledger.record import JobRecord
from ..ledger.schema import PENDING_SQL
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .finished import newest_finished
from .readonly import Source, reading, records, select_jobs
from .tags import tagged_jobs


def paused_types(source: Source) -> list[dict[str, Any]]:
    """Each paused type with its pending jobs (which no worker claims) and the operator's reason;
    none on a ledger from before pausing."""
    with reading(source) as conn:
        try:
            found = pausing.paused(conn)
        except (sa.exc.OperationalError, sa.exc.ProgrammingError):
            return []
        count = sa.select(sa.func.count()).select_from(jobs_table).where(sa.text(PENDING_SQL))
        return [
            {
                "type": p.job_type,
                "pending": conn.execute(count.where(jobs_table.c.type == p.job_type)).scalar_one(),
                "paused_at": p.paused_at,
                "reason": p.reason,
            }
            for p in found
        ]


def jobs(
    source: Source,
    *,
    status: JobStatus | str | None = None,
    job_type: str | None = None,
    since: datetime | None = None,
    tag: str | None = None,
    limit: int | None = 50,
) -> list[JobRecord]:
    """Jobs matching the filters. With ``status`` completed/failed, newest finished first;
    otherwise, or with a ``tag``, newest enqueued first (``since`` filters on enqueue time)."""
    status = JobStatus(status).value if status is not None else None
    if tag is not None:
        statuses = [] if status is None else [status]
        return tagged_jobs(source, tag, statuses=statuses, job_type=job_type, since=since, limit=limit)
    with reading(source) as conn:
        if status in ("completed", "failed", "cancelled") and since is None:
            return newest_finished(conn, (JobStatus(status),), job_type, None, None, limit)
        query = select_jobs()
        if status is not None:
            query = query.where(jobs_table.c.status == status)
        if job_type is not None:
            query = query.where(jobs_table.c.type == job_type)
        if since is not None:
            # ids are time-ordered: the id bound makes "created since" a primary-key range
            query = query.where(jobs_table.c.id >= ids.floor_id(since), jobs_table.c.created_at >= since)
        if status is not None:
            # Through the status's own index, then a sort bounded by the backlog (ordering by id
            # alone would walk the primary key through every finished job). The sort takes ids,
            # not whole rows; only the chosen rows are read in full.
            newest = (jobs_table.c.created_at.desc(), jobs_table.c.id.desc())
            picked = query.with_only_columns(jobs_table.c.id).order_by(*newest).limit(limit)
            return records(conn, select_jobs().where(jobs_table.c.id.in_(picked)).order_by(*newest))
        return records(conn, query.order_by(jobs_table.c.id.desc()).limit(limit))


def show(source: Source, job_id: str) -> JobRecord:
    """Everything about one job; raises JobNotFound."""
    with reading(source) as conn:
        row = conn.execute(select_jobs().where(jobs_table.c.id == job_id)).first()
    if row is None:
        raise JobNotFound(job_id)
    return JobRecord.from_row(row)


def cancel_requested(source: Source, job_id: str) -> str | None:
    """The reason of an operator's cancel that a running job's worker has yet to act on, if any."""
    query = sa.select(jobs_table.c.cancel_reason).where(
        jobs_table.c.id == job_id, jobs_table.c.status == JobStatus.CLAIMED.value
    )
    with reading(source) as conn:
        reason: str | None = conn.execute(query).scalar()
    return reason


def resolve_id(source: Source, text: str) -> str:
    """The one job id that ``text`` names: the whole id, or (as git takes commits) any unique
    prefix or suffix, in either case. JobNotFound if none, AmbiguousJobId if several."""
    wanted = text.strip().upper()
    if not wanted.isalnum():  # ULIDs are letters and digits: nothing to escape in LIKE below
        raise JobNotFound(text)
    job_id = jobs_table.c.id
    with reading(source) as conn:
        if conn.execute(sa.select(job_id).where(job_id == wanted)).first() is not None:
            return wanted
        shortened = sa.or_(job_id.like(f"{wanted}%"), job_id.like(f"%{wanted}"))
        found = [row[0] for row in conn.execute(sa.select(job_id).where(shortened).order_by(job_id).limit(6))]
    if not found:
        raise JobNotFound(text)
    if len(found) > 1:
        raise AmbiguousJobId(text, found)
    return str(found[0])


def children(source: Source, job_id: str, *, limit: int = 20) -> list[JobRecord]:
    """Jobs a job's handler enqueued (via ``ix_tether_jobs_parent``)."""
    query = select_jobs().where(jobs_table.c.parent_id == job_id).order_by(jobs_table.c.id).limit(limit)
    with reading(source) as conn:
        return records(conn, query)


def on_target(source: Source, target: str, *, limit: int = 20) -> list[JobRecord]:
    """Jobs on one target (``ordering_key``) in enqueue order, the latest ``limit`` of them."""
    query = select_jobs().where(jobs_table.c.ordering_key == target).order_by(jobs_table.c.id.desc()).limit(limit)
    with reading(source) as conn:
        return list(reversed(records(conn, query)))


def counts(source: Source) -> dict[tuple[str, str], int]:
    """Jobs by (status, type) over the whole ledger. Counts every row: covered by an index on
    (status, type) if there is one, otherwise a full scan (so neither status nor metrics use it)."""
    by = (jobs_table.c.status, jobs_table.c.type)
    with reading(source) as conn:
        rows = conn.execute(sa.select(*by, sa.func.count()).group_by(*by))
        return {(status, name): n for status, name, n in rows}
