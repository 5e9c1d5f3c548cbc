"""Stuck jobs (``tether stuck``): claimed jobs whose lock is older than the lock timeout, so
their worker is dead or hung."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ..ledger.record import JobRecord
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .readonly import Source, lock_timeout_of, now_of, reading, records, select_jobs


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
        .where(jobs_table.c.status == JobStatus.CLAIMED.value, jobs_table.c.locked_at < cutoff)
        .order_by(jobs_table.c.locked_at)
        .limit(limit)
    )
    with reading(source) as conn:
        return Stuck(now, lock_timeout, records(conn, query))
