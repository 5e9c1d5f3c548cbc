"""The periodic jobs as an operator sees them (``tether schedules``): every schedule with its
last run, pausing and resuming one, and a schedule's runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from .. import events
from ..errors import TetherError
from ..ledger.record import JobRecord
from ..ledger.schema import jobs as jobs_table
from ..ledger.schema import schedules as s
from ..worker.cron import first_slot
from ..worker.schedule import KEY_PREFIX
from .readonly import ledger_now, records, select_jobs


class UnknownSchedule(TetherError):
    """No schedule of that name is in the ledger."""


def listing(engine: sa.Engine) -> list[dict[str, Any]]:
    """Every schedule with its last run's job status (one read)."""
    last_status = (
        sa.select(jobs_table.c.status).where(jobs_table.c.id == s.c.last_job_id).scalar_subquery().label("last_status")
    )
    with engine.connect() as conn:
        rows = conn.execute(sa.select(s, last_status).order_by(s.c.name)).mappings().all()
    return [
        {
            "name": r["name"],
            "cron": r["cron"],
            "timezone": r["timezone"],
            "type": r["job_type"],
            "next_run": r["next_slot"],
            "last_run": r["last_slot"],
            "last_job_id": r["last_job_id"],
            "last_status": r["last_status"],
            "paused": bool(r["paused"]),
            "catch_up": r["catch_up"],
            "runs": r["run_count"],
            "limit": r["run_limit"],
            "missed": r["missed"],
            "start": r["start_at"],
            "end": r["end_at"],
        }
        for r in rows
    ]


def set_paused(engine: sa.Engine, name: str, paused: bool, now: datetime | None = None) -> dict[str, Any]:
    """Pause or resume a schedule. A resumed schedule's next slot is the first from ``now``
    (default: the ledger's clock, ``ledger_now``): slots that fell while it was paused are skipped
    (counted in ``missed`` only when a worker sees them late, so not here)."""
    with engine.begin() as conn:
        now = now or ledger_now(conn)
        row = conn.execute(sa.select(s).where(s.c.name == name)).one_or_none()
        if row is None:
            known = conn.execute(sa.select(s.c.name).order_by(s.c.name)).scalars().all()
            raise UnknownSchedule(f"no schedule named {name!r}; known: {', '.join(known) or 'none'}")
        values: dict[str, Any] = {"paused": paused, "updated_at": now}
        if not paused and row.paused:  # a finished schedule gets None again from its bounds
            values["next_slot"] = first_slot(
                row.cron,
                row.timezone,
                now,
                start=row.start_at,
                end=row.end_at,
                after=row.last_slot,
                runs=row.run_count,
                limit=row.run_limit,
            )
        conn.execute(sa.update(s).where(s.c.name == name).values(**values))
    events.emit("schedule_paused" if paused else "schedule_resumed", schedule=name)
    return {"name": name, "paused": paused, "next_run": values.get("next_slot", row.next_slot)}


def runs(engine: sa.Engine, name: str, limit: int | None = 50) -> list[JobRecord]:
    """A schedule's jobs, newest slot first (they carry ``schedule:NAME@SLOT`` as their key)."""
    query = (
        select_jobs()
        .where(jobs_table.c.idempotency_key.startswith(f"{KEY_PREFIX}{name}@", autoescape=True))
        .order_by(jobs_table.c.idempotency_key.desc())
        .limit(limit)
    )
    with engine.connect() as conn:
        return records(conn, query)
