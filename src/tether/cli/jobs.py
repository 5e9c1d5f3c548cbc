"""``tether jobs``: list jobs with filters."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import typer

from ..clock import SystemClock
from ..errors import ConfigError
from ..ledger.record import JobRecord
from ..ledger.status import JobStatus
from .app import JSON_OPTION, app, out, print_json
from .output import (
    LIMIT_HELP,
    first_line,
    ledger,
    limit_value,
    noted_dicts,
    parse_duration,
    progress_text,
    table,
    when,
)

if TYPE_CHECKING:
    import sqlalchemy as sa


@app.command()
def jobs(
    ctx: typer.Context,
    status: str | None = typer.Option(None, "--status", "-s", help="pending, claimed, completed, failed or cancelled."),
    job_type: str | None = typer.Option(None, "--type", "-t", help="Only jobs of this type."),
    since: str | None = typer.Option(None, "--since", help="Only jobs enqueued within this window, e.g. 30m, 2d."),
    schedule_name: str | None = typer.Option(
        None, "--schedule", help="Only the runs of this schedule (newest slot first; other filters apply too)."
    ),
    tag: str | None = typer.Option(None, "--tag", help="Only jobs carrying this tag (newest enqueued first)."),
    limit: int = typer.Option(50, "--limit", "-n", help=LIMIT_HELP),
    as_json: bool = JSON_OPTION,
) -> None:
    """List jobs with filters (status, type, since, tag), newest first.

    The "when" column is when a pending job may run, when a claimed job was claimed, or when a
    finished job completed or failed. Priority and every other column: --json.

    With --status completed or failed they are ordered by finish time. Payloads are never
    shown here; see `tether show ID --payload`.

    Example: tether jobs --status pending --type create_file --limit 20

    Example: tether jobs --tag tenant:acme --json   (each job with its tags and meta)
    """
    from ..observe.jobs import jobs as find_jobs
    from ..observe.jobs import paused_types

    if status is not None and status not in {s.value for s in JobStatus}:
        raise ConfigError(f"--status: {status!r} is not a status; use one of {', '.join(s.value for s in JobStatus)}")
    window = parse_duration(since, "--since") if since else None
    n = limit_value(limit)
    with ledger(ctx.obj) as engine:
        start = SystemClock().now() - window if window else None
        if schedule_name is not None:
            found = _schedule_runs(engine, schedule_name, status, job_type, start)[:n]
        else:
            found = find_jobs(engine, status=status, job_type=job_type, since=start, tag=tag, limit=n)
        paused = paused_types(engine)
        if as_json:
            print_json({"jobs": noted_dicts(engine, found), "paused": paused})
            return
    _print_jobs(found)
    for p in paused:
        because = f": {p['reason']}" if p["reason"] else ""
        out.print(f"paused: {p['type']} ({p['pending']} pending, not claimed){because}", markup=False)


def _schedule_runs(
    engine: sa.Engine, schedule_name: str, status: str | None, job_type: str | None, start: datetime | None
) -> list[JobRecord]:
    """The runs of one schedule, newest slot first, that the other filters let through."""
    from ..observe import schedules  # only for this filter

    return [
        j
        for j in schedules.runs(engine, schedule_name, limit=None)
        if (status is None or j.status.value == status)
        and (job_type is None or j.type == job_type)
        and (start is None or j.created_at >= start)
    ]


def _print_jobs(found: list[JobRecord]) -> None:
    table(
        None,
        ["id", "type", "status", "attempts", "created (UTC)", "when (UTC)", "worker", "last error"],
        [
            (
                j.id,
                j.type,
                j.status.value,
                f"{j.attempts}/{j.max_attempts}",
                when(j.created_at),
                _when(j),
                j.locked_by if j.status is JobStatus.CLAIMED else None,  # who holds it (a finished job keeps its last)
                first_line(j.last_error, 60),
            )
            for j in found
        ],
        empty="no jobs match",
    )


def _when(job: JobRecord) -> str:
    """The time that matters for the job's status."""
    if job.status is JobStatus.PENDING:
        return f"runs {when(job.run_at)}"
    if job.status is JobStatus.CLAIMED:
        progress = progress_text(job.progress)
        return f"claimed {when(job.claimed_at)}" + (f", {progress}" if progress else "")
    return f"{job.status.value} {when(job.completed_at)}"
