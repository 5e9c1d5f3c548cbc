"""The worker processes (``tether workers``, the web page's workers view): each one's host, pid,
threads, version, when it started and last beat, and the jobs it runs now; from the ledger's
register of workers (``ledger/workers.py``) and the claimed jobs they hold."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..ledger.record import JobRecord
from ..ledger.schema import jobs as jobs_table
from ..ledger.schema import workers as workers_table
from ..ledger.status import JobStatus
from .readonly import Source, lock_timeout_of, now_of, reading, records, select_jobs

RUNNING, STOPPED, GONE = "running", "stopped", "gone"
JOB_FIELDS = ("id", "type", "attempts", "claimed_at", "locked_at", "ordering_key", "progress")
"""What ``to_dict`` tells of each job a worker runs (``tether show ID`` tells the rest)."""


@dataclass(frozen=True)
class WorkerView:
    id: str
    host: str
    pid: int
    threads: int
    version: str
    started_at: datetime
    beat_at: datetime
    stopped_at: datetime | None
    state: str
    """``running``; ``stopped`` (it said so); ``gone``: no heartbeat for the lock timeout, so it
    died or hangs, and the stale-lock sweep gives its jobs back. A worker beats while it runs
    jobs (``reclaim.renew``), so one idle for the lock timeout reads as gone too."""
    jobs: list[JobRecord]
    """The jobs it holds now, oldest claim first (their progress as the handler reported it)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "threads": self.threads,
            "version": self.version,
            "state": self.state,
            "started_at": self.started_at.isoformat(),
            "beat_at": self.beat_at.isoformat(),
            "stopped_at": self.stopped_at.isoformat() if self.stopped_at else None,
            "jobs": [{k: v for k, v in j.to_dict().items() if k in JOB_FIELDS} for j in self.jobs],
        }


def workers(source: Source, *, lock_timeout: float | None = None, now: datetime | None = None) -> list[WorkerView]:
    """Every registered worker: running ones first, then stopped and gone, newest start first.
    A ledger from before the register lists none."""
    now = now_of(source, now)
    cutoff = now - timedelta(seconds=lock_timeout_of(source, lock_timeout))
    with reading(source) as conn:
        if not sa.inspect(conn).has_table(workers_table.name):
            return []
        rows = conn.execute(sa.select(workers_table).order_by(workers_table.c.started_at.desc())).all()
        held = records(
            conn,
            select_jobs().where(jobs_table.c.status == JobStatus.CLAIMED.value).order_by(jobs_table.c.claimed_at),
        )
    by_worker: dict[str, list[JobRecord]] = {}
    for job in held:
        by_worker.setdefault(job.locked_by or "", []).append(job)
    found = [
        WorkerView(
            r.id,
            r.host,
            r.pid,
            r.threads,
            r.version,
            r.started_at,
            r.beat_at,
            r.stopped_at,
            STOPPED if r.stopped_at is not None else GONE if r.beat_at < cutoff else RUNNING,
            by_worker.get(r.id, []),
        )
        for r in rows
    ]
    rank = {RUNNING: 0, STOPPED: 1, GONE: 2}
    return sorted(found, key=lambda w: rank[w.state])  # stable: newest start first within a state
