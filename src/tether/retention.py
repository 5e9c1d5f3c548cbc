"""Retention: delete finished jobs older than a cutoff (an explicit operator action).

Active jobs are never touched. A completed job that is the *latest* completed job for its
target (``ordering_key``, e.g. a file path) is kept whatever its age, because the reconciler
proves a file against exactly that job; purging it would leave the file unaccounted for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable

import sqlalchemy as sa

from . import events
from .errors import ConfigError, DatabaseUnavailable
from .readonly import Source, engine_of, now_of, reading
from .schema import Job
from .status import JobStatus

t = Job.__table__
FINISHED = (JobStatus.COMPLETED, JobStatus.FAILED)


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


def _purgeable(statuses: tuple[JobStatus, ...], cutoff: datetime) -> sa.ColumnElement[bool]:
    newer = t.alias("newer")
    superseded = sa.exists().where(
        newer.c.ordering_key == t.c.ordering_key,
        newer.c.status == JobStatus.COMPLETED.value,
        newer.c.id > t.c.id,
    )
    per_status = []
    for status in statuses:
        cond = t.c.status == status.value
        if status is JobStatus.COMPLETED:
            cond = sa.and_(cond, sa.or_(t.c.ordering_key.is_(None), superseded))
        per_status.append(cond)
    # completed_at is set by both finished edges; the (status, completed_at) index bounds the walk.
    return sa.and_(sa.or_(*per_status), t.c.completed_at < cutoff)


def purge(
    source: Source, *, older_than: timedelta, statuses: Iterable[JobStatus | str] = (JobStatus.COMPLETED,),
    dry_run: bool = False, now: datetime | None = None, batch_size: int = 1000,
) -> PurgeResult:
    """Delete jobs with a status in ``statuses`` (completed and/or failed) that finished more
    than ``older_than`` ago, in batches of ``batch_size`` so writers are never held up long."""
    chosen = tuple(JobStatus(s) for s in statuses)
    if not chosen:
        raise ConfigError("purge needs at least one status: completed and/or failed")
    bad = [s.value for s in chosen if s not in FINISHED]
    if bad:
        raise ConfigError(f"purge deletes finished jobs only (completed, failed), not {', '.join(bad)}")
    if older_than < timedelta(0):
        raise ConfigError(f"--older-than must not be negative, got {older_than}")
    cutoff = now_of(source, now) - older_than
    where = _purgeable(chosen, cutoff)
    with reading(source) as conn:
        rows = conn.execute(sa.select(t.c.status, t.c.type, sa.func.count()).where(where).group_by(t.c.status, t.c.type))
        planned = {(st, ty): n for st, ty, n in rows}
    result = PurgeResult(cutoff, chosen, dry_run, planned)
    if dry_run or not planned:
        return result
    deleted: dict[tuple[str, str], int] = {}
    engine = engine_of(source)
    while True:
        batch = sa.select(t.c.id).where(where).limit(batch_size).scalar_subquery()
        try:
            with engine.begin() as conn:
                gone = conn.execute(sa.delete(t).where(t.c.id.in_(batch)).returning(t.c.status, t.c.type)).all()
        except sa.exc.OperationalError as e:
            raise DatabaseUnavailable(f"purge stopped after deleting {sum(deleted.values())} job(s): {e.orig}") from e
        for st, ty in gone:
            deleted[(st, ty)] = deleted.get((st, ty), 0) + 1
        if len(gone) < batch_size:
            break
    events.emit("purged", count=sum(deleted.values()), cutoff=cutoff.isoformat(),
                statuses=[s.value for s in chosen])
    return PurgeResult(cutoff, chosen, False, deleted)
