"""``tether jobs``: list jobs with filters."""

from __future__ import annotations

from typing import Optional

import typer

from .. import observe
from ..clock import SystemClock
from ..errors import ConfigError
from ..status import JobStatus
from .app import app, print_json
from .output import JSON_OPTION, LIMIT_HELP, first_line, job_dicts, ledger, limit_value, parse_duration, table, when


@app.command()
def jobs(
    status: Optional[str] = typer.Option(None, "--status", "-s", help="pending, claimed, completed or failed."),
    job_type: Optional[str] = typer.Option(None, "--type", "-t", help="Only jobs of this type."),
    since: Optional[str] = typer.Option(None, "--since", help="Only jobs enqueued within this window, e.g. 30m, 2d."),
    limit: int = typer.Option(50, "--limit", "-n", help=LIMIT_HELP),
    as_json: bool = JSON_OPTION,
) -> None:
    """List jobs with filters (status, type, since), newest first.

    With --status completed or failed they are ordered by finish time. Payloads are never
    shown here; see `tether show ID --payload`.

    Example: tether jobs --status pending --type create_file --limit 20
    """
    if status is not None and status not in {s.value for s in JobStatus}:
        raise ConfigError(f"--status: {status!r} is not a status; use one of {', '.join(s.value for s in JobStatus)}")
    window = parse_duration(since, "--since") if since else None
    n = limit_value(limit)
    with ledger() as engine:
        start = SystemClock().now() - window if window else None
        found = observe.jobs(engine, status=status, job_type=job_type, since=start, limit=n)
    if as_json:
        print_json({"jobs": job_dicts(found)})
        return
    table(None, ["id", "type", "status", "attempts", "priority", "created (UTC)", "runs at (UTC)", "finished (UTC)",
                 "worker", "last error"],
          [(j.id, j.type, j.status.value, f"{j.attempts}/{j.max_attempts}", j.priority, when(j.created_at),
            when(j.run_at) if j.status is JobStatus.PENDING else "", when(j.completed_at), j.locked_by,
            first_line(j.last_error, 50)) for j in found], empty="no jobs match")
