"""Drift remembered: the findings of the newest reconcile runs, kept in the ledger.

Each run's findings (drift, unreadable, not checked, and the ignored ones with their rule) are
written with its verdict (``runs.record``), in the same transaction; only the newest
``config.drift_runs()`` runs' findings are kept, so the table's size follows the drift of a few
runs, never the number of targets or of runs. ``tether drift`` reads the last run's findings
without touching the disk; ``tether drift --target`` tells when a target first and last drifted
within the kept runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa

from .. import config
from ..jobtypes.base import Difference
from ..ledger.engine import READ_ONLY
from ..ledger.schema import drift_findings as table
from ..ledger.schema import reconcile_runs as runs
from .drift import DRIFT, Finding, Report


def rows_of(run_id: str, report: Report) -> list[dict[str, Any]]:
    """The rows one run's findings are stored as."""
    reported = [(f, None) for f in report.findings]
    return [
        {
            "run_id": run_id,
            "target": f.path,
            "status": f.status,
            "job_id": f.job_id,
            "ignored_by": rule,
            "finding": orjson.dumps(f).decode(),  # a dataclass: orjson writes it as ``to_dict`` does, in C
        }
        for f, rule in (*reported, *report.ignored)
    ]


def store(conn: sa.Connection, run_id: str, report: Report, keep: int | None = None) -> None:
    """Write ``report``'s findings as run ``run_id``'s and delete those of runs older than the
    newest ``keep`` (in the caller's transaction, after its run row was written)."""
    rows = rows_of(run_id, report)
    if rows:
        conn.execute(sa.insert(table), rows)
    kept = sa.select(runs.c.id).order_by(runs.c.id.desc()).limit(config.drift_runs(keep)).subquery()
    oldest = conn.execute(sa.select(sa.func.min(kept.c.id))).scalar_one()
    if oldest is not None:
        conn.execute(sa.delete(table).where(table.c.run_id < oldest))


@dataclass(frozen=True)
class LastRun:
    """The last recorded run: its id, when it checked, its exit code, its findings as stored."""

    run_id: str
    checked_at: datetime
    finished_at: datetime
    mode: str
    exit_code: int
    counts: dict[str, int]
    findings: list[dict[str, Any]]
    ignored: list[dict[str, Any]]


def last_run(engine: sa.Engine) -> LastRun | None:
    """The newest run and its findings; None if no run was recorded."""
    with engine.connect().execution_options(**READ_ONLY) as conn:
        if not sa.inspect(conn).has_table(table.name):
            return None
        run = conn.execute(sa.select(runs).order_by(runs.c.id.desc()).limit(1)).first()
        if run is None:
            return None
        query = sa.select(table.c.finding, table.c.ignored_by).where(table.c.run_id == run.id).order_by(table.c.target)
        found: list[dict[str, Any]] = []
        ignored: list[dict[str, Any]] = []
        for finding, rule in conn.execute(query):
            data = orjson.loads(finding)
            if rule is None:
                found.append(data)
            else:
                ignored.append({**data, "rule": rule})
    counts = orjson.loads(run.counts)
    return LastRun(run.id, run.checked_at, run.finished_at, run.mode, run.exit_code, counts, found, ignored)


def finding_of(data: dict[str, Any]) -> Finding:
    """A stored finding (``Finding.to_dict``, perhaps with its ``rule``) as a Finding again."""
    fields = {k: v for k, v in data.items() if k not in ("rule", "differences")}
    return Finding(**fields, differences=tuple(Difference(**d) for d in data.get("differences") or ()))


def last_report(engine: sa.Engine) -> Report | None:
    """The last recorded run as a Report (what the ui's drift page shows before it runs a check)."""
    last = last_run(engine)
    if last is None:
        return None
    report = Report(last.checked_at, last.mode == "content", False, counts=dict(last.counts))
    report.finished_at = last.finished_at
    report.findings = [finding_of(f) for f in last.findings]
    report.ignored = [(finding_of(f), f["rule"]) for f in last.ignored]
    return report


@dataclass(frozen=True)
class TargetDrift:
    """A target across the kept runs: when it first and last drifted, in how many runs, and its
    latest finding (None if it never drifted in them)."""

    target: str
    runs_kept: int
    drifted_runs: int
    first_drift: datetime | None
    last_drift: datetime | None
    last_status: str | None
    last_finding: dict[str, Any] | None


def of_target(conn: sa.Connection, target: str) -> list[tuple[datetime, str, str | None, dict[str, Any]]]:
    """Every kept finding on ``target`` (its path as a check names it), oldest run first: when the
    run checked, the status, the ignore rule that matched (None: reported), the finding. What a
    target's history interleaves with its jobs."""
    query = (
        sa.select(runs.c.checked_at, table.c.status, table.c.ignored_by, table.c.finding)
        .join(runs, runs.c.id == table.c.run_id)
        .where(table.c.target == target)
        .order_by(table.c.run_id)
    )
    return [(when, status, rule, orjson.loads(f)) for when, status, rule, f in conn.execute(query)]


def for_target(engine: sa.Engine, target: str) -> TargetDrift:
    """``target``'s drift (a finding with a drift status, ignored or not) in the kept runs."""
    with engine.connect().execution_options(**READ_ONLY) as conn:
        recorded = conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one()
        kept = min(recorded, config.drift_runs())
        rows = [(when, status, finding) for when, status, _, finding in of_target(conn, target) if status in DRIFT]
    if not rows:
        return TargetDrift(target, kept, 0, None, None, None, None)
    last = rows[-1]
    return TargetDrift(target, kept, len(rows), rows[0][0], last[0], last[1], last[2])
