"""``tether durations``: how long jobs take, per type."""

from __future__ import annotations

import typer

from .app import JSON_OPTION, app, print_json
from .output import ledger, parse_duration, seconds, table


@app.command()
def durations(
    ctx: typer.Context,
    since: str = typer.Option("24h", "--since", help="Window of completion times, back from now, e.g. 1h, 7d."),
    job_type: str | None = typer.Option(None, "--type", "-t", help="Only jobs of this type."),
    exact: bool = typer.Option(
        False, "--exact", help="Measure every completed job of the window, not a sample (reads each one)."
    ),
    sample: int = typer.Option(
        5_000, "--sample", min=1, help="Completed jobs measured at most when not --exact (a busy window is sampled)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """How long jobs take: count, p50, p95, p99, max per type over a window.

    Measured claimed_at -> completed_at of completed jobs (the last attempt only). JSON gives
    seconds. Types whose jobs record a cost (AI extractions) also show dollars and tokens. A
    window of more than --sample completed jobs is measured on one job in k (chosen by completion
    time, as the web page's durations are), and says so; --exact measures every one.

    Example: tether durations --since 1h --type create_file
    """
    from ..observe.durations import duration_sample

    window = parse_duration(since, "--since")
    limit = None if exact else sample
    with ledger(ctx.obj) as engine:
        found = duration_sample(engine, since=window, limit=limit, job_type=job_type, with_spend=True)
    rows = found.types
    if as_json:
        sampled = {"total": found.total, "every": found.every, "measured": found.measured}
        print_json({"window_seconds": window.total_seconds(), "sample": sampled, "types": [d.to_dict() for d in rows]})
        return
    columns = ["type", "measured" if found.every > 1 else "count", "p50", "p95", "p99", "max"]
    cells = [[d.type, d.count, seconds(d.p50), seconds(d.p95), seconds(d.p99), seconds(d.max)] for d in rows]
    if any(d.spend for d in rows):  # AI extractions: what they cost
        estimated = " (est.)" if found.every > 1 else ""
        columns += [f"cost (USD){estimated}", f"tokens in{estimated}", f"tokens out{estimated}"]
        for row, d in zip(cells, rows, strict=True):
            row += [f"{d.spend.cost_usd:.4f}", d.spend.input_tokens, d.spend.output_tokens] if d.spend else ["", "", ""]
    table(f"Durations of jobs completed in the last {since}", columns, cells, empty="no jobs completed")
    if found.every > 1:
        typer.echo(
            f"sampled: {found.measured:,} of the window's {found.total:,} completed jobs measured "
            f"(1 in {found.every}, by completion time); counts and max are the sample's, cost and tokens "
            f"the sample's times {found.every}; --exact measures every job"
        )
