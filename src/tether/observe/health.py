"""The health verdict of a ledger read through SQLAlchemy (any backend): the statements
``tether status`` runs, and ``health``, the Python form of the command.

The verdict has three homes: ``backlog`` (the ledger at one instant, ``Stats``), ``verdict``
(the rules that judge it, ``assess``) and this module (reading both from the ledger). The first
two load no SQLAlchemy, so ``lite`` judges a SQLite file with them too, running this module's
statements as compiled ahead.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..ledger.schema import ACTIVE_TARGETED_SQL, CLAIMED_SQL, PENDING_SQL, QUARANTINED_SQL
from ..ledger.schema import jobs as jobs_table
from ..ledger.schema import paused as paused_table
from ..ledger.status import JobStatus
from .backlog import Stats, stats_of
from .readonly import Source, done, engine_of, lock_timeout_of, now_of, one_in, reading, seconds_between
from .states import condition
from .verdict import Activity, Health, Thresholds, activity_of, assess


def stats_statements(
    now: datetime, cutoff: datetime, dialect: str = "sqlite"
) -> dict[str, sa.Select[Any] | sa.CompoundSelect[Any]]:
    """The statements ``stats`` runs, by name (``backlog``, ``failed``, ``stuck``, ``quarantined``,
    ``deepest``, ``paused``): ``now``, and ``cutoff``, the lock time before which a claimed job is stuck.
    ``lite`` runs the same, compiled for SQLite ahead of time (``compile_lite``)."""
    # Each status through its own partial index, so only the backlog is read: the condition
    # is written as the index's own literal, which both databases match when they plan.
    # The oldest pending job comes from the same walk: a query of its own walked the pending
    # jobs a second time, reading each row to check its status.
    # The largest payload from its size kept at enqueue: no payload is read.
    # Of the pending jobs not due yet, the same walk tells those never tried from those waiting
    # out a retry's backoff (states.py).
    ready = sa.func.min(sa.case((jobs_table.c.run_at <= now, jobs_table.c.run_at)))
    largest = sa.func.max(jobs_table.c.payload_bytes)
    scheduled, retrying = (sa.func.count(sa.case((condition(s, now, cutoff), 1))) for s in ("scheduled", "retrying"))
    per_status = [
        sa.select(
            jobs_table.c.type,
            jobs_table.c.status,
            sa.func.count(),
            ready,
            sa.func.min(jobs_table.c.created_at),
            largest,
            scheduled,
            retrying,
        )
        .where(sa.text(cond))
        .group_by(jobs_table.c.type, jobs_table.c.status)
        for cond in (PENDING_SQL, CLAIMED_SQL)
    ]
    # The target with the most outstanding jobs (ties: the first by key), from the index of
    # active jobs with a target, never a row: the backlog, however many finished jobs there are.
    n = sa.func.count().label("n")
    key: sa.ColumnClause[Any] = sa.literal_column("ordering_key")
    # SQLite, named: it prefers ix_tether_jobs_on_target (every job with a target, covering), and
    # walked all of a ledger's history there (an empty partial index has no statistics).
    active_targeted: Any = jobs_table
    if dialect == "sqlite":
        active_targeted = sa.text(f"{jobs_table.name} INDEXED BY ix_tether_jobs_target_active")
    claimed = jobs_table.c.status == JobStatus.CLAIMED.value
    return {
        "backlog": sa.union_all(*per_status),
        "failed": sa.select(sa.func.count()).where(jobs_table.c.status == JobStatus.FAILED.value, done()),
        "stuck": sa.select(sa.func.count()).where(claimed, jobs_table.c.locked_at < cutoff),
        # Through the partial index of exactly these rows (empty while no worker dies).
        "quarantined": sa.select(sa.func.count()).select_from(jobs_table).where(sa.text(QUARANTINED_SQL)),
        "deepest": sa.select(key, n)
        .select_from(active_targeted)
        .where(sa.text(ACTIVE_TARGETED_SQL))
        .group_by(key)
        .order_by(n.desc(), key)
        .limit(1),
        # Read last: a ledger from before pausing has no such table (paused_of).
        "paused": sa.select(paused_table.c.job_type, paused_table.c.paused_at, paused_table.c.reason).order_by(
            paused_table.c.job_type
        ),
    }


def finished_statement(
    since: datetime,
    until: datetime,
    job_type: str | None = None,
    statuses: tuple[JobStatus, ...] = (JobStatus.COMPLETED, JobStatus.FAILED),
) -> sa.Select[Any]:
    """(status, count) of the jobs of ``statuses`` (completed and failed: the success rate's)
    finished in ``[since, until]``."""
    query = (
        sa.select(jobs_table.c.status, sa.func.count())
        .where(
            jobs_table.c.status.in_([s.value for s in statuses]),
            jobs_table.c.completed_at >= since,
            jobs_table.c.completed_at <= until,
        )
        .group_by(jobs_table.c.status)
    )
    return query if job_type is None else query.where(jobs_table.c.type == job_type)


def run_times_statement(
    dialect: str, since: datetime, job_type: str | None = None, *, every: int = 1
) -> sa.Select[Any]:
    """(type, seconds) of each job completed since ``since``; one in ``every`` (see
    ``durations.duration_sample`` for which one)."""
    seconds = seconds_between(dialect, jobs_table.c.claimed_at, jobs_table.c.completed_at)
    query = sa.select(jobs_table.c.type, seconds).where(
        jobs_table.c.status == JobStatus.COMPLETED.value,
        jobs_table.c.completed_at >= since,
        jobs_table.c.claimed_at.is_not(None),
    )
    if job_type is not None:
        query = query.where(jobs_table.c.type == job_type)
    if every > 1:
        query = query.where(one_in(dialect, every))
    return query


def stats(source: Source, *, lock_timeout: float | None = None, now: datetime | None = None) -> Stats:
    """Outstanding (pending, claimed) jobs by type, failed and stuck counts, oldest pending job."""
    now = now_of(source, now)
    lock_timeout = lock_timeout_of(source, lock_timeout)
    query = stats_statements(now, now - timedelta(seconds=lock_timeout), engine_of(source).dialect.name)
    with reading(source) as conn:
        per_status = conn.execute(query["backlog"]).all()
        failed, stuck, quarantined = (conn.execute(query[k]).scalar_one() for k in ("failed", "stuck", "quarantined"))
        deepest = conn.execute(query["deepest"]).first()
        paused = paused_of(conn, query["paused"])
    return stats_of(now, lock_timeout, per_status, failed, stuck, quarantined, deepest, paused)


def paused_of(conn: sa.Connection, query: Any) -> list[Any]:
    """The paused types' rows; none on a ledger from before pausing (read-only commands never
    upgrade a ledger), whose missing table is the last statement of the read."""
    try:
        return list(conn.execute(query).all())
    except (sa.exc.OperationalError, sa.exc.ProgrammingError):
        return []


def activity(source: Source, window: float, *, now: datetime | None = None) -> Activity:
    """The window's finished jobs, from the same statements as ``tether recent`` and ``durations``."""
    until = now_of(source, now)
    since = until - timedelta(seconds=window)
    with reading(source) as conn:
        finished = conn.execute(finished_statement(since, until)).all()
        run_times = conn.execute(run_times_statement(conn.dialect.name, since)).all()
    return activity_of(window, finished, run_times)


def health(
    source: Source,
    thresholds: Thresholds | None = None,
    *,
    lock_timeout: float | None = None,
    now: datetime | None = None,
) -> Health:
    """``assess(stats(source, ...), thresholds, activity(...))`` at one ``now``: the Python form
    of ``tether status``."""
    th = thresholds or Thresholds()
    now = now_of(source, now)
    return assess(stats(source, lock_timeout=lock_timeout, now=now), th, activity(source, th.window, now=now))
