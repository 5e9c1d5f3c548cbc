"""The last reconcile verdicts, kept in the ledger: when disk and ledger were last compared, and
whether they agreed. ``reconcile`` records each check's summary here, and with it the check's
findings (``findings.py``, which keeps fewer runs' of them); ``metrics`` and the operator's pages
read the newest one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import orjson
import sqlalchemy as sa

from .. import events
from ..ledger import ids
from ..ledger.schema import reconcile_runs as runs
from . import findings
from .drift import Report

KEEP = 100
"""Verdicts kept: each record deletes the older ones, so the table never grows."""


@dataclass(frozen=True)
class Verdict:
    """One check's summary: ``exit_code`` 0 in sync, 1 could not check, 2 drift."""

    checked_at: datetime
    finished_at: datetime
    mode: str
    exit_code: int
    drift: int
    counts: dict[str, int]


def record(engine: sa.Engine, report: Report) -> bool:
    """Keep ``report``'s verdict; False (and a ``reconcile_not_recorded`` event) if the ledger
    refused the write, e.g. a read-only database user: the check itself still stands."""
    finished = report.finished_at or report.checked_at
    run_id = ids.new_id(report.checked_at)
    row = {
        "id": run_id,
        "checked_at": report.checked_at,
        "finished_at": finished,
        "mode": "content" if report.content else "exists",
        "exit_code": report.exit_code,
        "drift": report.drift,
        "counts": orjson.dumps(report.counts).decode(),
    }
    kept = sa.select(runs.c.id).order_by(runs.c.id.desc()).limit(KEEP).subquery()
    try:
        with engine.begin() as conn:
            conn.execute(runs.insert().values(**row))
            oldest_kept = conn.execute(sa.select(sa.func.min(kept.c.id))).scalar_one()
            conn.execute(runs.delete().where(runs.c.id < oldest_kept))
            findings.store(conn, run_id, report)
    except sa.exc.DBAPIError as e:
        events.emit("reconcile_not_recorded", reason=" ".join(str(e.orig).split()))
        return False
    return True


def last(conn: sa.Connection) -> Verdict | None:
    """The newest verdict, or None if no check was recorded (or the ledger predates the table)."""
    if not sa.inspect(conn).has_table(runs.name):
        return None
    row = conn.execute(sa.select(runs).order_by(runs.c.id.desc()).limit(1)).first()
    if row is None:
        return None
    return Verdict(row.checked_at, row.finished_at, row.mode, row.exit_code, row.drift, orjson.loads(row.counts))
