"""Retention: delete finished jobs older than a cutoff (an explicit operator action).

Active jobs are never touched. A completed job that is the *latest* completed job for its
target (``ordering_key``, e.g. a file path) is kept whatever its age, because the reconciler
proves a file against exactly that job; purging it would leave the file unaccounted for. A
job's attempts (``tether_attempts``) are deleted with it, in its transaction, and kept with it:
a kept job's history stays whole. Reconcile's own runs are not purge's to delete: they are kept
to their own bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from .. import events
from ..errors import ConfigError, DatabaseUnavailable
from ..ledger.schema import attempts as attempts_table
from ..ledger.schema import job_tags, repairs
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .readonly import Source, engine_of, now_of, reading

FINISHED = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


@dataclass(frozen=True)
class PurgeResult:
    """What was (or, with ``dry_run``, would be) deleted, by status and type."""

    cutoff: datetime
    statuses: tuple[JobStatus, ...]
    dry_run: bool
    by_status_type: dict[tuple[str, str], int]

    @property
    def total(self) -> int:
        return sum(self.by_status_type.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "cutoff": self.cutoff.isoformat(),
            "statuses": [s.value for s in self.statuses],
            "total": self.total,
            "by_type": [{"status": st, "type": ty, "count": n} for (st, ty), n in sorted(self.by_status_type.items())],
        }


def _purgeable(status: JobStatus, cutoff: datetime) -> sa.ColumnElement[bool]:
    cond = sa.and_(jobs_table.c.status == status.value, jobs_table.c.completed_at < cutoff)
    if status is JobStatus.COMPLETED:
        newer = jobs_table.alias("newer")
        superseded = sa.exists().where(
            newer.c.ordering_key == jobs_table.c.ordering_key,
            newer.c.status == JobStatus.COMPLETED.value,
            newer.c.id > jobs_table.c.id,
        )
        cond = sa.and_(cond, sa.or_(jobs_table.c.ordering_key.is_(None), superseded))
    return cond


def purge(
    source: Source,
    *,
    older_than: timedelta,
    statuses: Iterable[JobStatus | str] = (JobStatus.COMPLETED,),
    dry_run: bool = False,
    now: datetime | None = None,
    batch_size: int = 1000,
) -> PurgeResult:
    """Delete jobs with a status in ``statuses`` (completed, failed, cancelled) that finished more
    than ``older_than`` ago, in batches of ``batch_size`` so writers are never held up long.
    With ``dry_run``, only count them by status and type."""
    chosen = tuple(dict.fromkeys(JobStatus(s) for s in statuses))
    if not chosen:
        raise ConfigError("purge needs at least one status: completed, failed and/or cancelled")
    bad = [s.value for s in chosen if s not in FINISHED]
    if bad:
        raise ConfigError(f"purge deletes finished jobs only (completed, failed, cancelled), not {', '.join(bad)}")
    if older_than < timedelta(0):
        raise ConfigError(f"--older-than must not be negative, got {older_than}")
    cutoff = now_of(source, now) - older_than
    if dry_run:
        planned: dict[tuple[str, str], int] = {}
        with reading(source) as conn:
            for status in chosen:
                rows = conn.execute(
                    sa.select(jobs_table.c.status, jobs_table.c.type, sa.func.count())
                    .where(_purgeable(status, cutoff))
                    .group_by(jobs_table.c.status, jobs_table.c.type)
                )
                planned.update({(st, ty): n for st, ty, n in rows})
        return PurgeResult(cutoff, chosen, True, planned)
    deleted: dict[tuple[str, str], int] = {}
    try:
        for status in chosen:
            _delete_batches(engine_of(source), _purgeable(status, cutoff), batch_size, deleted)
    except sa.exc.OperationalError as e:
        raise DatabaseUnavailable(f"purge stopped after deleting {sum(deleted.values())} job(s): {e.orig}") from e
    events.emit("purged", count=sum(deleted.values()), cutoff=cutoff.isoformat(), statuses=[s.value for s in chosen])
    return PurgeResult(cutoff, chosen, False, deleted)


def _delete_batches(
    engine: sa.Engine, where: sa.ColumnElement[bool], batch_size: int, deleted: dict[tuple[str, str], int]
) -> None:
    # Walk the (status, completed_at) index forward from where the last batch ended: the kept
    # rows (latest per target) are passed once, not re-read by every batch.
    after: datetime | None = None
    while True:
        query = sa.select(jobs_table.c.id, jobs_table.c.completed_at).where(where)
        if after is not None:
            query = query.where(jobs_table.c.completed_at >= after)
        with engine.begin() as conn:
            rows = conn.execute(query.order_by(jobs_table.c.completed_at).limit(batch_size)).all()
            if not rows:
                return
            ids = [r.id for r in rows]
            # A job's tags go with it (tether_job_tags: schema.py).
            conn.execute(sa.delete(job_tags).where(job_tags.c.job_id.in_(ids)))
            conn.execute(sa.delete(repairs).where(repairs.c.job_id.in_(ids)))  # a repair job's link
            gone = conn.execute(
                sa.delete(jobs_table).where(jobs_table.c.id.in_(ids)).returning(jobs_table.c.status, jobs_table.c.type)
            ).all()
            conn.execute(sa.delete(attempts_table).where(attempts_table.c.job_id.in_(ids)))  # a job's go with it
        for st, ty in gone:
            deleted[(st, ty)] = deleted.get((st, ty), 0) + 1
        if len(rows) < batch_size:
            return
        after = rows[-1].completed_at
