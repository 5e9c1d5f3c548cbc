"""Jobs finished per minute, completed and failed apart: the overview's throughput chart."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from ..ledger.schema import UTCDateTime
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .readonly import Source, now_of, reading, seconds_between


@dataclass(frozen=True)
class Minute:
    start: datetime
    completed: int
    failed: int


def per_minute(source: Source, *, minutes: int = 60, now: datetime | None = None) -> list[Minute]:
    """The last ``minutes`` whole-or-partial minutes up to ``now``, oldest first, each with the
    jobs that finished in it. Counted in SQL by minute through ``ix_tether_jobs_done`` (status,
    completed_at): one row per minute and outcome comes back, however many jobs finished."""
    until = now_of(source, now)
    since = until - timedelta(minutes=minutes)
    t = jobs_table.c
    with reading(source) as conn:
        minute = sa.cast(
            seconds_between(conn.dialect.name, sa.literal(since, UTCDateTime), t.completed_at) / 60, sa.Integer
        )
        query = (
            sa.select(t.status, minute, sa.func.count())
            .where(
                t.status.in_((JobStatus.COMPLETED.value, JobStatus.FAILED.value)),
                t.completed_at >= since,
                t.completed_at <= until,
            )
            .group_by(t.status, minute)
        )
        rows = conn.execute(query).all()
    counts: dict[tuple[str, int], int] = {}
    for status, m, n in rows:
        key = (status, min(max(int(m), 0), minutes - 1))  # a job finished at ``now`` ends the last minute
        counts[key] = counts.get(key, 0) + n
    return [
        Minute(since + timedelta(minutes=i), counts.get(("completed", i), 0), counts.get(("failed", i), 0))
        for i in range(minutes)
    ]
