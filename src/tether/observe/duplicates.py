"""Idempotency keys used by more than one job (``tether duplicates``): re-runs after a job with
the key completed or failed, since the unique index forbids two *active* jobs with one key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ..ledger.record import JobRecord
from ..ledger.schema import jobs as jobs_table
from .readonly import Source, reading, records, select_jobs


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
    """Keys used by more than one job, most jobs first. Groups by (type, idempotency_key):
    without an index on those columns this reads the whole table (twice: once to find the keys,
    once for their jobs)."""
    keyed: list[sa.ColumnElement[bool]] = [jobs_table.c.idempotency_key.is_not(None)]
    if job_type is not None:
        keyed.append(jobs_table.c.type == job_type)
    groups = (
        sa.select(jobs_table.c.type, jobs_table.c.idempotency_key, sa.func.count().label("n"))
        .where(*keyed)
        .group_by(jobs_table.c.type, jobs_table.c.idempotency_key)
        .having(sa.func.count() > 1)
        .order_by(sa.desc("n"), jobs_table.c.type, jobs_table.c.idempotency_key)
        .limit(limit)
    )
    with reading(source) as conn:
        found = [(r.type, r.idempotency_key) for r in conn.execute(groups)]
        if not found:
            return []
        # A join on the same grouped query: each key's jobs are one index seek when an index
        # on (type, idempotency_key) exists.
        g = groups.subquery()
        same_key = sa.and_(jobs_table.c.type == g.c.type, jobs_table.c.idempotency_key == g.c.idempotency_key)
        members = records(conn, select_jobs().join(g, same_key))
    by_key: dict[tuple[str, str], list[JobRecord]] = {k: [] for k in found}
    for job in sorted(members, key=lambda j: j.id):
        by_key[(job.type, job.idempotency_key)].append(job)  # type: ignore[index]  # joined on a key: never None
    return [DuplicateGroup(name, key, by_key[(name, key)]) for name, key in found]
