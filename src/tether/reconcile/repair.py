"""Applying an approved repair plan: its jobs enqueued in one transaction, each linked to the job
it runs again (``tether_repairs``), after checking that no planned target has had a job since
the plan was made. A stale plan is refused whole, naming the targets that moved: what it
proposed was decided on a world that is no longer the ledger's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ..errors import ConfigError, TetherError
from ..ledger.record import InsertResult
from ..ledger.schema import repairs
from .plan import Plan, Step, latest_jobs

if TYPE_CHECKING:
    from ..coordinator import Coordinator


class StalePlan(TetherError):
    """A job was enqueued on a planned target after the plan was made; nothing was enqueued."""

    def __init__(self, moved: list[str]) -> None:
        self.targets = moved
        shown = ", ".join(moved[:10]) + (f" and {len(moved) - 10} more" if len(moved) > 10 else "")
        super().__init__(
            f"the plan is stale: {len(moved)} target(s) had a job since it was made ({shown}); "
            "nothing was enqueued: make a new plan (tether reconcile --plan)"
        )


def chosen(plan: Plan, only: Sequence[str] = ()) -> list[Step]:
    """The plan's job steps, or those of the targets ``only`` names (a path or a target key);
    a name that is not a planned job is a ConfigError."""
    steps = plan.jobs
    if not only:
        return steps
    picked = [s for s in steps if s.path in only or s.target in only]
    unknown = sorted(set(only) - {s.path for s in picked} - {s.target for s in picked})
    if unknown:
        raise ConfigError(f"--only {', '.join(unknown)}: not a target this plan enqueues a job for")
    return picked


def apply_plan(coordinator: Coordinator, plan: Plan, only: Sequence[str] = ()) -> list[InsertResult]:
    """Enqueue the plan's jobs (or those of ``only``'s targets) in one transaction; StalePlan if a
    planned target has had a job since the plan, ConfigError if the plan is another ledger's."""
    if plan.ledger_id != coordinator.queue.ledger_id:
        raise ConfigError(
            f"the plan was made on ledger {plan.ledger_id}, not this one ({coordinator.queue.ledger_id}): make it here"
        )
    steps = chosen(plan, only)
    if not steps:
        return []
    queue = coordinator.queue
    payloads = [coordinator.registry.get(s.job_type or "").payload_model.model_validate(s.payload) for s in steps]
    built = [queue.enqueuer.build([p])[0] for p in payloads]  # each keeps its own type's options
    now = coordinator.clock.now()
    links = [
        {"job_id": job.id, "repair_of": s.repair_of, "ordering_key": s.target, "finding": s.finding, "applied_at": now}
        for s, job in zip(steps, built, strict=True)
    ]
    with coordinator.engine.begin() as conn:
        conn.exec_driver_sql(queue.sql.LOCK_FOR_REPAIR)
        latest = latest_jobs(conn, sorted({s.target for s in steps}))
        moved = sorted({s.path for s in steps if latest.get(s.target) != s.latest_job_id})
        if moved:
            raise StalePlan(moved)
        with queue.backend.write(conn) as cur:
            results = queue.enqueuer.insert_all(cur, built)
            queue.wakeup.notify_in(cur)
        conn.execute(sa.insert(repairs), links)
    queue.enqueuer.committed(results)
    return results


def repairs_of(conn: sa.Connection, ordering_key: str) -> list[dict[str, object]]:
    """The repair jobs applied on a target, oldest first: which job each ran again, the finding it
    answered, when (for a target's history)."""
    query = sa.select(repairs).where(repairs.c.ordering_key == ordering_key).order_by(repairs.c.job_id)
    return [dict(row._mapping) for row in conn.execute(query)]
