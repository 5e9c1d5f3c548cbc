"""The operator's questions (spec §8) as functions returning data; the CLI only renders them.

Every function takes a ``Coordinator`` or a bare ``Engine`` (``source``) and reads in one
read-only transaction, so a busy worker never waits behind an observer. Each query walks an
index, never the whole table, except where a docstring says so (see benchmarks/status.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..errors import AmbiguousJobId, ConfigError, JobNotFound
from ..ledger import ids
from ..ledger.record import JobRecord
from ..ledger.schema import ACTIVE_TARGETED_SQL, CLAIMED_SQL, PENDING_SQL, QUARANTINED_SQL
from ..ledger.status import JobStatus
from . import billing
from .backlog import Stats as Stats
from .backlog import TargetBacklog as TargetBacklog  # `X as X`: defined in backlog, this API too
from .backlog import TypeBacklog as TypeBacklog
from .backlog import stats_of
from .readonly import COLUMNS, finished, lock_timeout_of, now_of, reading, records, select_jobs, t
from .readonly import NoLedger as NoLedger  # `X as X`: NoLedger, Source, open_ledger are this API too
from .readonly import Source as Source
from .readonly import open_ledger as open_ledger
from .runtimes import percentile as percentile
from .runtimes import run_times_of


def _status_str(status: JobStatus | str) -> str:
    return JobStatus(status).value


# -- what is outstanding? ------------------------------------------------------------------------


def stats_statements(now: datetime, cutoff: datetime) -> dict[str, sa.Select[Any] | sa.CompoundSelect[Any]]:
    """The statements ``stats`` runs, by name (``backlog``, ``failed``, ``stuck``, ``quarantined``,
    ``deepest``): ``now``, and ``cutoff``, the lock time before which a claimed job is stuck.
    ``lite`` runs the same, compiled for SQLite ahead of time (``compile_lite``)."""
    # Each status through its own partial index, so only the backlog is read: the condition
    # is written as the index's own literal, which both databases match when they plan.
    # The oldest pending job comes from the same walk: a query of its own walked the pending
    # jobs a second time, reading each row to check its status (70 ms of 180 at 20,000).
    # The largest payload from its size kept at enqueue: no payload is read.
    ready, largest = sa.func.min(sa.case((t.c.run_at <= now, t.c.run_at))), sa.func.max(t.c.payload_bytes)
    per_status = [
        sa.select(t.c.type, t.c.status, sa.func.count(), ready, sa.func.min(t.c.created_at), largest)
        .where(sa.text(cond))
        .group_by(t.c.type, t.c.status)
        for cond in (PENDING_SQL, CLAIMED_SQL)
    ]
    # The target with the most outstanding jobs (ties: the first by key), from the index of
    # active jobs with a target, never a row: the backlog, however many finished jobs there are.
    n = sa.func.count().label("n")
    return {
        "backlog": sa.union_all(*per_status),
        "failed": sa.select(sa.func.count()).where(t.c.status == JobStatus.FAILED.value, finished()),
        "stuck": sa.select(sa.func.count()).where(t.c.status == JobStatus.CLAIMED.value, t.c.locked_at < cutoff),
        # Through the partial index of exactly these rows (empty while no worker dies).
        "quarantined": sa.select(sa.func.count()).select_from(t).where(sa.text(QUARANTINED_SQL)),
        "deepest": sa.select(t.c.ordering_key, n)
        .where(sa.text(ACTIVE_TARGETED_SQL))
        .group_by(t.c.ordering_key)
        .order_by(n.desc(), t.c.ordering_key)
        .limit(1),
    }


def stats(source: Source, *, lock_timeout: float | None = None, now: datetime | None = None) -> Stats:
    """Outstanding (pending, claimed) jobs by type, failed and stuck counts, oldest pending job."""
    now = now_of(source, now)
    lock_timeout = lock_timeout_of(source, lock_timeout)
    query = stats_statements(now, now - timedelta(seconds=lock_timeout))
    with reading(source) as conn:
        per_status = conn.execute(query["backlog"]).all()
        failed, stuck, quarantined = (conn.execute(query[k]).scalar_one() for k in ("failed", "stuck", "quarantined"))
        deepest = conn.execute(query["deepest"]).first()
    return stats_of(now, lock_timeout, per_status, failed, stuck, quarantined, deepest)


# -- what failed, what is stuck? -----------------------------------------------------------------


def failed(
    source: Source, *, job_type: str | None = None, since: datetime | None = None, limit: int | None = 50
) -> list[JobRecord]:
    """Failed jobs, most recently failed first (``completed_at`` is when they failed)."""
    with reading(source) as conn:
        return _finished(conn, (JobStatus.FAILED,), job_type, since, None, limit)


@dataclass(frozen=True)
class Stuck:
    """Claimed jobs whose lock is older than the timeout: their worker is dead or hung."""

    now: datetime
    lock_timeout: float
    jobs: list[JobRecord]

    def held_for(self, job: JobRecord) -> float:
        return (self.now - job.locked_at).total_seconds() if job.locked_at else 0.0


def stuck(
    source: Source, *, lock_timeout: float | None = None, now: datetime | None = None, limit: int | None = 100
) -> Stuck:
    """Claimed jobs whose lock (renewed by heartbeats) is older than ``lock_timeout`` seconds,
    longest-held first. The stale-lock sweep of any running worker will reclaim them."""
    now = now_of(source, now)
    lock_timeout = lock_timeout_of(source, lock_timeout)
    cutoff = now - timedelta(seconds=lock_timeout)
    query = (
        select_jobs()
        .where(t.c.status == JobStatus.CLAIMED.value, t.c.locked_at < cutoff)
        .order_by(t.c.locked_at)
        .limit(limit)
    )
    with reading(source) as conn:
        return Stuck(now, lock_timeout, records(conn, query))


# -- how long do jobs take? ----------------------------------------------------------------------


@dataclass(frozen=True)
class Durations:
    """claimed_at -> completed_at of completed jobs of one type, in seconds (to the ms): how long
    a worker held the job's last attempt. A worker that claims a batch stamps one claimed_at on
    all of it and commits outcomes in groups, so this includes the wait behind the batch's
    earlier jobs; the handler's own run time is ``duration_ms`` in the ``completed`` event."""

    type: str
    count: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float
    spend: Spend | None = None
    """What the type's jobs paid (AI extractions): None for types whose results carry no cost."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Spend:
    """Summed over a type's completed jobs whose result records ``cost_usd`` (an AI assistant's
    envelope): US dollars and tokens."""

    jobs: int
    cost_usd: float
    input_tokens: int
    output_tokens: int


def spend(source: Source, *, since: datetime, job_type: str | None = None) -> dict[str, Spend]:
    """Per type, the cost and tokens of jobs completed since ``since`` (see Spend; ``billing``
    says which results count and how they are read)."""
    window = [t.c.status == JobStatus.COMPLETED.value, t.c.completed_at >= since]
    if job_type is not None:
        window.append(t.c.type == job_type)
    with reading(source) as conn:
        by_model = billing.bills(conn, *window)
    totals: dict[str, billing.Bill] = {}
    for (name, _), bill in by_model.items():
        total = totals.setdefault(name, billing.Bill())
        total.jobs += bill.jobs
        total.cost_usd += bill.cost_usd
        total.input_tokens += bill.input_tokens
        total.output_tokens += bill.output_tokens
    return {name: Spend(b.jobs, round(b.cost_usd, 6), b.input_tokens, b.output_tokens) for name, b in totals.items()}


def seconds_between(dialect: str, start: Any, end: Any) -> Any:
    # SQLite keeps times as text; PostgreSQL as timestamptz. The subtraction happens in SQL so
    # a million rows are not parsed into datetimes in Python.
    if dialect == "sqlite":
        return (sa.func.julianday(end) - sa.func.julianday(start)) * 86400.0
    # EXTRACT gives numeric (Decimal in Python) since PostgreSQL 14; a float is what callers want.
    return sa.cast(sa.extract("epoch", end - start), sa.Float)


def durations(
    source: Source,
    *,
    since: datetime | timedelta = timedelta(hours=24),
    job_type: str | None = None,
    now: datetime | None = None,
    with_spend: bool = True,
) -> list[Durations]:
    """Per type: count, p50, p95, p99, max and mean run time of jobs completed since ``since``
    (a time, or a window back from now), and (``with_spend``) what they cost. Walks
    ``ix_tether_jobs_done`` for the window only, reading each completed job's row."""
    if isinstance(since, timedelta):
        since = now_of(source, now) - since
    with reading(source) as conn:
        by_type = _run_times(conn, since, job_type, every=1)
    spent = spend(source, since=since, job_type=job_type) if with_spend else {}
    return _summaries(by_type, spent)


@dataclass(frozen=True)
class DurationSample:
    """``durations`` of a window measured on a sample: ``every`` is 1 when each of the window's
    ``total`` completed jobs was measured, k when one in k was (each type's ``count`` is then the
    jobs measured, its ``max`` the sample's). No spend: money is summed exactly, by ``spend``."""

    since: datetime
    total: int
    every: int
    types: list[Durations]

    @property
    def measured(self) -> int:
        return sum(d.count for d in self.types)


def duration_sample(
    source: Source,
    *,
    since: datetime | timedelta = timedelta(hours=24),
    limit: int = 5_000,
    now: datetime | None = None,
) -> DurationSample:
    """Percentiles per type from about ``limit`` of the window's completed jobs at most, so a busy
    window costs what a quiet one does (the web page's durations). The window's total is counted
    from ``ix_tether_jobs_done`` alone; above ``limit``, the jobs measured are those whose
    completion time's microsecond is a multiple of k = ceil(total / limit): unrelated to a job's
    type or run time, and read from the index entry itself, so SQLite reads only the chosen jobs'
    rows (PostgreSQL filters after reading each row: the sample bounds the work in Python only)."""
    if limit < 1:
        raise ConfigError(f"a duration sample holds at least one job, not {limit}")
    if isinstance(since, timedelta):
        since = now_of(source, now) - since
    with reading(source) as conn:
        total = conn.execute(
            sa.select(sa.func.count()).where(t.c.status == JobStatus.COMPLETED.value, t.c.completed_at >= since)
        ).scalar_one()
        every = max(1, -(-total // limit))
        by_type = _run_times(conn, since, None, every=every)
    return DurationSample(since, total, every, _summaries(by_type, {}))


def run_times_statement(
    dialect: str, since: datetime, job_type: str | None = None, *, every: int = 1
) -> sa.Select[Any]:
    """(type, seconds) of each job completed since ``since``; one in ``every``."""
    seconds = seconds_between(dialect, t.c.claimed_at, t.c.completed_at)
    query = sa.select(t.c.type, seconds).where(
        t.c.status == JobStatus.COMPLETED.value, t.c.completed_at >= since, t.c.claimed_at.is_not(None)
    )
    if job_type is not None:
        query = query.where(t.c.type == job_type)
    if every > 1:
        query = query.where(_microsecond(dialect, t.c.completed_at) % every == 0)
    return query


def _run_times(conn: sa.Connection, since: datetime, job_type: str | None, *, every: int) -> dict[str, list[float]]:
    """Run times (seconds, to the ms) of jobs completed since ``since``, by type; one in ``every``."""
    query = run_times_statement(conn.dialect.name, since, job_type, every=every)
    return run_times_of(conn.execute(query.execution_options(yield_per=10_000)))


def _microsecond(dialect: str, column: Any) -> Any:
    # SQLite keeps times as fixed-width text ('YYYY-MM-DD HH:MM:SS.ffffff'): the microseconds are
    # characters 21-26. PostgreSQL's "microseconds" field counts the seconds too (0-59,999,999).
    if dialect == "sqlite":
        return sa.cast(sa.func.substr(column, 21, 6), sa.Integer)
    return sa.cast(sa.extract("microseconds", column), sa.Integer)


def _summaries(by_type: dict[str, list[float]], spent: dict[str, Spend]) -> list[Durations]:
    out = []
    for name in sorted(by_type):
        values = sorted(by_type[name])
        out.append(
            Durations(
                name,
                len(values),
                percentile(values, 50),
                percentile(values, 95),
                percentile(values, 99),
                values[-1],
                sum(values) / len(values),
                spent.get(name),
            )
        )
    return out


# -- are there duplicates? -----------------------------------------------------------------------


@dataclass(frozen=True)
class DuplicateGroup:
    """One type + idempotency key used by more than one job (at most one of them active)."""

    type: str
    idempotency_key: str
    jobs: list[JobRecord] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "idempotency_key": self.idempotency_key,
            "count": len(self.jobs),
            "jobs": [
                {
                    "id": j.id,
                    "status": j.status.value,
                    "created_at": j.created_at.isoformat(),
                    "completed_at": j.completed_at.isoformat() if j.completed_at else None,
                }
                for j in self.jobs
            ],
        }


def duplicates(source: Source, *, job_type: str | None = None, limit: int | None = 50) -> list[DuplicateGroup]:
    """Keys used by more than one job, most jobs first. The unique index only forbids two
    *active* jobs with one key, so these are re-runs after completion or failure. Groups by
    (type, idempotency_key): without an index on those columns this reads the whole table
    (twice: once to find the keys, once for their jobs)."""
    keyed: list[sa.ColumnElement[bool]] = [t.c.idempotency_key.is_not(None)]
    if job_type is not None:
        keyed.append(t.c.type == job_type)
    groups = (
        sa.select(t.c.type, t.c.idempotency_key, sa.func.count().label("n"))
        .where(*keyed)
        .group_by(t.c.type, t.c.idempotency_key)
        .having(sa.func.count() > 1)
        .order_by(sa.desc("n"), t.c.type, t.c.idempotency_key)
        .limit(limit)
    )
    with reading(source) as conn:
        found = [(r.type, r.idempotency_key) for r in conn.execute(groups)]
        if not found:
            return []
        # A join on the same grouped query: each key's jobs are one index seek when an index
        # on (type, idempotency_key) exists.
        g = groups.subquery()
        members = records(
            conn, select_jobs().join(g, sa.and_(t.c.type == g.c.type, t.c.idempotency_key == g.c.idempotency_key))
        )
    by_key: dict[tuple[str, str], list[JobRecord]] = {k: [] for k in found}
    for job in sorted(members, key=lambda j: j.id):
        by_key[(job.type, job.idempotency_key)].append(job)  # type: ignore[index]  # joined on a key: never None
    return [DuplicateGroup(name, key, by_key[(name, key)]) for name, key in found]


# -- what ran lately? listing and one job --------------------------------------------------------


@dataclass(frozen=True)
class Recent:
    """Jobs that finished (completed or failed) in ``[since, until]``, newest first."""

    since: datetime
    until: datetime
    completed: int
    failed: int
    jobs: list[JobRecord]


def finished_statement(since: datetime, until: datetime, job_type: str | None = None) -> sa.Select[Any]:
    """(status, count) of the jobs completed and failed in ``[since, until]``."""
    query = (
        sa.select(t.c.status, sa.func.count())
        .where(
            t.c.status.in_((JobStatus.COMPLETED.value, JobStatus.FAILED.value)),
            t.c.completed_at >= since,
            t.c.completed_at <= until,
        )
        .group_by(t.c.status)
    )
    return query if job_type is None else query.where(t.c.type == job_type)


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
        counts: dict[str, int] = dict(conn.execute(finished_statement(since, until, job_type)).tuples().all())
        listed = _finished(conn, (JobStatus.COMPLETED, JobStatus.FAILED), job_type, since, until, limit)
    return Recent(since, until, counts.get("completed", 0), counts.get("failed", 0), listed)


def _finished(
    conn: sa.Connection,
    statuses: tuple[JobStatus, ...],
    job_type: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int | None,
) -> list[JobRecord]:
    # One walk of ix_tether_jobs_done per status, newest first, merged here: with ``status IN``
    # neither database can read that index in completed_at order across the statuses, so it
    # sorted the whole window before taking the newest few (4.7 s for a window of 1,000,000).
    newest = (t.c.completed_at.desc(), t.c.id.desc())
    found: list[JobRecord] = []
    for status in statuses:
        query = select_jobs().where(t.c.status == status.value, finished())
        if since is not None:
            query = query.where(t.c.completed_at >= since)
        if until is not None:
            query = query.where(t.c.completed_at <= until)
        if job_type is not None:
            query = query.where(t.c.type == job_type)
        found += records(conn, query.order_by(*newest).limit(limit))
    if len(statuses) > 1:
        found.sort(key=lambda j: (j.completed_at, j.id), reverse=True)
    return found[:limit] if limit is not None else found


def jobs(
    source: Source,
    *,
    status: JobStatus | str | None = None,
    job_type: str | None = None,
    since: datetime | None = None,
    limit: int | None = 50,
) -> list[JobRecord]:
    """Jobs matching the filters. With ``status`` completed/failed, newest finished first;
    otherwise newest enqueued first (``since`` filters on enqueue time)."""
    status = _status_str(status) if status is not None else None
    with reading(source) as conn:
        if status in ("completed", "failed") and since is None:
            return _finished(conn, (JobStatus(status),), job_type, None, None, limit)
        query = select_jobs()
        if status is not None:
            query = query.where(t.c.status == status)
        if job_type is not None:
            query = query.where(t.c.type == job_type)
        if since is not None:
            # ids are time-ordered: the id bound makes "created since" a primary-key range
            query = query.where(t.c.id >= ids.floor_id(since), t.c.created_at >= since)
        if status is not None:
            # Through the status's own index, then a sort bounded by the backlog (ordering by id
            # alone would walk the primary key through every finished job). The sort takes ids,
            # not whole rows; only the chosen rows are read in full.
            newest = (t.c.created_at.desc(), t.c.id.desc())
            picked = query.with_only_columns(t.c.id).order_by(*newest).limit(limit)
            return records(conn, select_jobs().where(t.c.id.in_(picked)).order_by(*newest))
        return records(conn, query.order_by(t.c.id.desc()).limit(limit))


def show(source: Source, job_id: str) -> JobRecord:
    """Everything about one job; raises JobNotFound."""
    with reading(source) as conn:
        row = conn.execute(select_jobs().where(t.c.id == job_id)).first()
    if row is None:
        raise JobNotFound(job_id)
    return JobRecord.from_row(row)


def resolve_id(source: Source, text: str) -> str:
    """The one job id that ``text`` names: the whole id, or (as git takes commits) any unique
    prefix or suffix, in either case. JobNotFound if none, AmbiguousJobId if several."""
    wanted = text.strip().upper()
    if not wanted.isalnum():  # ULIDs are letters and digits: nothing to escape in LIKE below
        raise JobNotFound(text)
    with reading(source) as conn:
        if conn.execute(sa.select(t.c.id).where(t.c.id == wanted)).first() is not None:
            return wanted
        shortened = sa.or_(t.c.id.like(f"{wanted}%"), t.c.id.like(f"%{wanted}"))
        found = [row[0] for row in conn.execute(sa.select(t.c.id).where(shortened).order_by(t.c.id).limit(6))]
    if not found:
        raise JobNotFound(text)
    if len(found) > 1:
        raise AmbiguousJobId(text, found)
    return str(found[0])


def children(source: Source, job_id: str, *, limit: int = 20) -> list[JobRecord]:
    """Jobs a job's handler enqueued (via ``ix_tether_jobs_parent``)."""
    with reading(source) as conn:
        return records(conn, select_jobs().where(t.c.parent_id == job_id).order_by(t.c.id).limit(limit))


def counts(source: Source) -> dict[tuple[str, str], int]:
    """Jobs by (status, type) over the whole ledger. Counts every row: covered by an index on
    (status, type) if there is one, otherwise a full scan (so neither status nor metrics use it)."""
    with reading(source) as conn:
        rows = conn.execute(sa.select(t.c.status, t.c.type, sa.func.count()).group_by(t.c.status, t.c.type))
        return {(status, name): n for status, name, n in rows}


# -- pages of jobs (keyset) and failures by error: what the web page asks ----------------------


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

    def __post_init__(self) -> None:
        if self.status is not None:
            object.__setattr__(self, "status", _status_str(self.status))
        if self.key is not None and self.job_type is None:
            raise ConfigError("a key filter needs a type: idempotency keys are unique per type only")


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
    by_finish = where.status in ("completed", "failed")
    query = sa.select(t.c.id)
    for column, value in (
        (t.c.status, where.status),
        (t.c.type, where.job_type),
        (t.c.ordering_key, where.target),
        (t.c.idempotency_key, where.key),
    ):
        if value is not None:
            query = query.where(column == value)
    if by_finish:
        query = query.where(finished())
        if where.since is not None:
            query = query.where(t.c.completed_at >= where.since)
        if where.until is not None:
            query = query.where(t.c.completed_at < where.until)
    else:
        if where.since is not None:  # ids are time-ordered: "enqueued since" is a primary-key range
            query = query.where(t.c.id >= ids.floor_id(where.since), t.c.created_at >= where.since)
        if where.until is not None:
            query = query.where(t.c.id < ids.floor_id(where.until), t.c.created_at < where.until)
    # Ordering a backlog by id would walk the primary key through every finished job to find it.
    time = t.c.completed_at if by_finish else t.c.created_at if where.status is not None else None
    order = [t.c.id] if time is None else [time, t.c.id]
    if after is not None:
        query = query.where(_after(after, order, oldest_first))
    sort = [c if oldest_first else c.desc() for c in order]
    picked = query.order_by(*sort).limit(limit + 1)
    if time is not None:  # the sort takes ids; only the chosen rows are read in full
        picked = select_jobs().where(t.c.id.in_(picked)).order_by(*sort)
    else:
        picked = picked.with_only_columns(*COLUMNS)
    with reading(source) as conn:
        found = records(conn, picked)
    more = len(found) > limit
    found = found[:limit]
    cursor = _cursor(found[-1], time) if more else None
    return JobPage(found, cursor, by_finish)


def _cursor(job: JobRecord, time: Any) -> str:
    if time is None:
        return job.id
    at = getattr(job, time.name)
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
        sa.select(t.c.type, t.c.last_error, sa.func.count(), sa.func.max(t.c.completed_at), sa.func.max(t.c.id))
        .where(t.c.status == JobStatus.FAILED.value, finished())
        .group_by(t.c.type, t.c.last_error)
    )
    if job_type is not None:
        query = query.where(t.c.type == job_type)
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


def on_target(source: Source, target: str, *, limit: int = 20) -> list[JobRecord]:
    """Jobs on one target (``ordering_key``) in enqueue order, the latest ``limit`` of them."""
    query = select_jobs().where(t.c.ordering_key == target).order_by(t.c.id.desc()).limit(limit)
    with reading(source) as conn:
        return list(reversed(records(conn, query)))
