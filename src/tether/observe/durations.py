"""How long jobs take: run-time percentiles per type over a window (``tether durations``), on a
sample of a busy window (as the web page measures it) or in full, with what the type's jobs paid."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..errors import ConfigError
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .billing import Spend, spend
from .health import run_times_statement
from .readonly import Source, now_of, reading
from .verdict import percentile, run_times_of

SAMPLE = 5_000
"""Completed jobs ``tether durations`` measures at most, unless asked for every one."""


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
    return duration_sample(source, since=since, limit=None, job_type=job_type, now=now, with_spend=with_spend).types


@dataclass(frozen=True)
class DurationSample:
    """``durations`` of a window measured on a sample: ``every`` is 1 when each of the window's
    ``total`` completed jobs was measured, k when one in k was (each type's ``count`` is then the
    jobs measured, its ``max`` the sample's, its ``spend`` the sample's times k: an estimate)."""

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
    limit: int | None = SAMPLE,
    job_type: str | None = None,
    now: datetime | None = None,
    with_spend: bool = False,
) -> DurationSample:
    """Percentiles per type from about ``limit`` of the window's completed jobs at most, so a busy
    window costs what a quiet one does (``tether durations``, the web page's durations). The
    window's total is counted from ``ix_tether_jobs_done`` alone (every type's: the index holds
    no type); above ``limit``, the jobs measured are those whose completion time's microsecond is
    a multiple of k = ceil(total / limit): unrelated to a job's type or run time, and read from
    the index entry itself, so SQLite reads only the chosen jobs' rows (PostgreSQL filters after
    reading each row: the sample bounds the work in Python only). ``with_spend``: what the
    measured jobs paid, times k. ``limit`` None: every job, uncounted (``durations``); ``total``
    is then the jobs measured."""
    if limit is not None and limit < 1:
        raise ConfigError(f"a duration sample holds at least one job, not {limit}")
    if isinstance(since, timedelta):
        since = now_of(source, now) - since
    completed = (jobs_table.c.status == JobStatus.COMPLETED.value, jobs_table.c.completed_at >= since)
    with reading(source) as conn:
        total = None if limit is None else conn.execute(sa.select(sa.func.count()).where(*completed)).scalar_one()
        every = 1 if total is None or limit is None else max(1, -(-total // limit))
        by_type = _run_times(conn, since, job_type, every=every)
    spent = spend(source, since=since, job_type=job_type, every=every) if with_spend else {}
    types = _summaries(by_type, spent)
    return DurationSample(since, sum(d.count for d in types) if total is None else total, every, types)


def _run_times(conn: sa.Connection, since: datetime, job_type: str | None, *, every: int) -> dict[str, list[float]]:
    """Run times (seconds, to the ms) of jobs completed since ``since``, by type; one in ``every``."""
    query = run_times_statement(conn.dialect.name, since, job_type, every=every)
    return run_times_of(conn.execute(query.execution_options(yield_per=10_000)))


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
