"""``tether failed``: what failed and why."""

from __future__ import annotations

import typer

from ..clock import SystemClock
from .app import JSON_OPTION, app, print_json
from .output import LIMIT_HELP, first_line, ledger, limit_value, noted_dicts, parse_duration, table, when


@app.command()
def failed(
    ctx: typer.Context,
    job_type: str | None = typer.Option(None, "--type", "-t", help="Only jobs of this type."),
    since: str | None = typer.Option(None, "--since", help="Only jobs that failed within this window, e.g. 1h, 7d."),
    tag: str | None = typer.Option(None, "--tag", help="Only jobs carrying this tag (newest enqueued first)."),
    limit: int = typer.Option(50, "--limit", "-n", help=LIMIT_HELP),
    as_json: bool = JSON_OPTION,
) -> None:
    """What failed and why: type, id, attempts, when, first line of the last error.

    Latest first. The whole error: `tether show ID`. Retry: `tether retry ID` or
    `tether retry --failed`.

    Example: tether failed --type create_file --since 24h
    """
    from ..observe.finished import failed

    window = parse_duration(since, "--since") if since else None
    n = limit_value(limit)
    with ledger(ctx.obj) as engine:
        start = SystemClock().now() - window if window else None
        if tag is None:
            jobs = failed(engine, job_type=job_type, since=start, limit=n)
        else:
            from ..observe.tags import tagged_jobs

            jobs = tagged_jobs(engine, tag, statuses=["failed"], job_type=job_type, finished_since=start, limit=n)
        if as_json:
            print_json({"jobs": noted_dicts(engine, jobs)})
            return
    table(
        "Failed jobs",
        ["type", "id", "attempts", "failed at (UTC)", "last error"],
        [
            (j.type, j.id, f"{j.attempts}/{j.max_attempts}", when(j.completed_at), first_line(j.last_error))
            for j in jobs
        ],
        empty="no failed jobs",
    )
