"""``tether recent``: what finished lately."""

from __future__ import annotations

import typer

from .app import JSON_OPTION, app, out, print_json
from .output import (
    LIMIT_HELP,
    first_line,
    job_dicts,
    ledger,
    limit_value,
    parse_duration,
    seconds,
    table,
    when,
)


@app.command()
def recent(
    ctx: typer.Context,
    since: str = typer.Option("1h", "--since", help="Window back from now, e.g. 15m, 1h, 2d."),
    job_type: str | None = typer.Option(None, "--type", "-t", help="Only jobs of this type."),
    limit: int = typer.Option(100, "--limit", "-n", help=LIMIT_HELP),
    as_json: bool = JSON_OPTION,
) -> None:
    """What ran lately: jobs that completed, failed or were cancelled in the window, newest first.

    Example: tether recent --since 1h
    """
    from ..observe.finished import recent

    window = parse_duration(since, "--since")
    n = limit_value(limit)
    with ledger(ctx.obj) as engine:
        r = recent(engine, since=window, job_type=job_type, limit=n)
    if as_json:
        print_json(
            {
                "since": r.since.isoformat(),
                "until": r.until.isoformat(),
                "completed": r.completed,
                "failed": r.failed,
                "cancelled": r.cancelled,
                "jobs": job_dicts(r.jobs),
            }
        )
        return
    cancelled = f", {r.cancelled} cancelled" if r.cancelled else ""
    out.print(f"{r.completed} completed, {r.failed} failed{cancelled} since {when(r.since)} UTC", markup=False)
    rows = []
    for j in r.jobs:
        took = seconds((j.completed_at - j.claimed_at).total_seconds()) if j.completed_at and j.claimed_at else ""
        rows.append(
            (
                when(j.completed_at),
                j.status.value,
                j.type,
                j.id,
                j.attempts,
                took,
                first_line(j.last_error, 60) if j.status.value in ("failed", "cancelled") else "",
            )
        )
    table(
        None,
        ["finished (UTC)", "status", "type", "id", "attempts", "took", "error"],
        rows,
        empty="nothing finished in the window",
    )
