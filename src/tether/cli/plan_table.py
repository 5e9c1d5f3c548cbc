"""How a repair plan and ignored findings print as tables (``reconcile --plan``, ``repair apply``,
``reconcile``, ``drift``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .app import out

if TYPE_CHECKING:
    from rich.table import Table

    from ..reconcile.check import Report
    from ..reconcile.plan import Plan, Step


def table(*columns: str) -> Table:
    from rich.table import Table

    shown = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in columns:
        shown.add_column(column, overflow="fold")
    return shown


def job_of(step: Step) -> str:
    """The job a step enqueues, as an operator reads it."""
    if step.job_type is None:
        return f"no job: {step.reason}"
    again = f" again (repair of {step.repair_of})" if step.repair_of else ""
    return f"{step.job_type}{again}"


def print_plan(plan: Plan, report: Report, out_file: Path | None) -> None:
    jobs = plan.jobs
    out.print(
        f"plan at {plan.made_at.isoformat()} (ledger {plan.ledger_id}, newest job {plan.newest_job_id or 'none'}): "
        f"{len(jobs)} job(s) for {len(plan.steps)} finding(s)"
    )
    if plan.steps:
        shown = table("target", "finding", "job")
        for step in plan.steps:
            shown.add_row(step.path, step.finding, job_of(step))
        out.print(shown)
    print_ignored((f.path, f.status, rule) for f, rule in report.ignored)
    if out_file is not None:
        out.print(f"written to {out_file}: apply it with `tether repair apply {out_file}`")
    elif jobs:
        out.print("nothing enqueued: write it with --out FILE, then `tether repair apply FILE`")


def print_ignored(rows: Iterable[tuple[str, str, str]]) -> None:
    """Findings an ignore rule matched: (path, status, rule) each."""
    rows = list(rows)
    if not rows:
        return
    out.print(f"ignored by rule ({len(rows)}):")
    shown = table("path", "status", "rule")
    for row in rows:
        shown.add_row(*row)
    out.print(shown)
