"""Pages of jobs by keyset (the web page's job list): a filter (``JobFilter``), and each page
starting after the last row of the page before, never at an OFFSET."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..errors import ConfigError
from ..ledger import ids
from ..ledger.record import JobRecord
from ..ledger.schema import job_tags
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .readonly import COLUMNS, Source, done, reading, records, select_jobs
from .states import PENDING_STATES, STATES, condition


@dataclass(frozen=True)
class JobFilter:
    """What ``jobs_page`` selects: each field narrows, ``None`` leaves it open. ``target`` is an
    ``ordering_key`` as stored (``file:a/b.json``); ``key`` an idempotency key, which is unique per
    type only, so it needs ``job_type`` (the index on keys starts with the type)."""

    status: str | None = None
    job_type: str | None = None
    target: str | None = None
    key: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    state: str | None = None
    """One of ``states.STATES`` (it implies the status), judged at ``at``: (now, lock cutoff)."""
    at: tuple[datetime, datetime] | None = None
    tag: str | None = None  # jobs carrying this tag (observe/tags.py)

    def __post_init__(self) -> None:
        if self.state is not None:
            if self.state not in STATES or self.at is None:
                raise ConfigError(f"state {self.state!r} is not one of {', '.join(STATES)}")
            pending = self.state in PENDING_STATES
            object.__setattr__(self, "status", (JobStatus.PENDING if pending else JobStatus.CLAIMED).value)
        if self.status is not None:
            object.__setattr__(self, "status", JobStatus(self.status).value)
        if self.key is not None and self.job_type is None:
            raise ConfigError("a key filter needs a type: idempotency keys are unique per type only")

    @property
    def by_finish(self) -> bool:
        """Whether the listing is of finished jobs, ordered by finish time."""
        return self.status in ("completed", "failed")


@dataclass(frozen=True)
class JobPage:
    """One page of ``jobs_page``: ``after`` is the cursor of the next page (``None``: last page)."""

    jobs: list[JobRecord]
    after: str | None
    by_finish: bool


def jobs_page(
    source: Source, where: JobFilter, *, after: str | None = None, oldest_first: bool = False, limit: int = 50
) -> JobPage:
    """A page of jobs by keyset, never OFFSET: each page starts after the last row of the one
    before (``after``, the cursor it returned), so jobs added meanwhile never shift a page.

    Completed and failed jobs are ordered by finish time (cursor ``completed_at|id``) through
    ``ix_tether_jobs_done``; pending and claimed ones by enqueue time (``created_at|id``) through
    their status's partial index, sorting only that backlog's ids; any other listing by id (enqueue
    order too) through the primary key, or the target's or key's index when one is given. A type
    alone has no index: its pages walk the primary key and skip other types' jobs."""
    if limit < 1:
        raise ConfigError(f"a page holds at least one job, not {limit}")
    query = _selected(where)
    # Ordering a backlog by id would walk the primary key through every finished job to find it.
    time = (
        jobs_table.c.completed_at if where.by_finish else jobs_table.c.created_at if where.status is not None else None
    )
    order = [jobs_table.c.id] if time is None else [time, jobs_table.c.id]
    if after is not None:
        query = query.where(_after(after, order, oldest_first))
    sort = [c if oldest_first else c.desc() for c in order]
    picked = query.order_by(*sort).limit(limit + 1)
    if time is not None:  # the sort takes ids; only the chosen rows are read in full
        picked = select_jobs().where(jobs_table.c.id.in_(picked)).order_by(*sort)
    else:
        picked = picked.with_only_columns(*COLUMNS)
    with reading(source) as conn:
        found = records(conn, picked)
    more = len(found) > limit
    found = found[:limit]
    cursor = _cursor(found[-1], where.by_finish, time is None) if more else None
    return JobPage(found, cursor, where.by_finish)


def _selected(where: JobFilter) -> sa.Select[Any]:
    """The ids ``where`` selects, unordered: its fields as conditions, its window on finish time
    for finished jobs and on enqueue time for the others."""
    query = sa.select(jobs_table.c.id)
    for column, value in (
        (jobs_table.c.status, where.status),
        (jobs_table.c.type, where.job_type),
        (jobs_table.c.ordering_key, where.target),
        (jobs_table.c.idempotency_key, where.key),
    ):
        if value is not None:
            query = query.where(column == value)
    if where.state is not None and where.at is not None:
        query = query.where(condition(where.state, *where.at))
    if where.tag is not None:  # the tag's range of tether_job_tags' primary key, each job by its id
        query = query.where(jobs_table.c.id.in_(sa.select(job_tags.c.job_id).where(job_tags.c.tag == where.tag)))
    if where.by_finish:
        query = query.where(done())
        if where.since is not None:
            query = query.where(jobs_table.c.completed_at >= where.since)
        if where.until is not None:
            query = query.where(jobs_table.c.completed_at < where.until)
        return query
    # ids are time-ordered: "enqueued since" is a primary-key range
    if where.since is not None:
        query = query.where(jobs_table.c.id >= ids.floor_id(where.since), jobs_table.c.created_at >= where.since)
    if where.until is not None:
        query = query.where(jobs_table.c.id < ids.floor_id(where.until), jobs_table.c.created_at < where.until)
    return query


def _cursor(job: JobRecord, by_finish: bool, by_id: bool) -> str:
    """The cursor of the page after ``job``: its id alone, or ``time|id`` of its finish or enqueue."""
    if by_id:
        return job.id
    at = job.completed_at if by_finish else job.created_at
    assert at is not None  # listed by finish time: only finished jobs
    return f"{at.isoformat()}|{job.id}"


def _after(cursor: str, order: list[Any], ascending: bool) -> sa.ColumnElement[bool]:
    """Rows strictly past ``cursor`` in the listing's order. The leading column's bound is
    written on its own (``<=``), so the index range starts at the cursor, not at its end."""
    if len(order) == 1:
        return order[0] > cursor if ascending else order[0] < cursor  # type: ignore[no-any-return]
    at_text, _, job_id = cursor.partition("|")
    try:
        at = datetime.fromisoformat(at_text)
    except ValueError as e:
        raise ConfigError(f"page cursor {cursor!r} is not one this page gave out") from e
    if at.tzinfo is None or not job_id:
        raise ConfigError(f"page cursor {cursor!r} is not one this page gave out")
    col, tie = order
    if ascending:
        return sa.and_(col >= at, sa.or_(col > at, tie > job_id))
    return sa.and_(col <= at, sa.or_(col < at, tie < job_id))
