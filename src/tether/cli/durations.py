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
    as_json: bool = JSON_OPTION,
) -> None:
    """How long jobs take: count, p50, p95, p99, max per type over a window.

    Measured claimed_at -> completed_at of completed jobs (the last attempt only). JSON gives
    seconds. Types whose jobs record a cost (AI extractions) also show dollars and tokens.

    Example: tether durations --since 1h --type create_file
    """
    from ..observe.durations import durations

    window = parse_duration(since, "--since")
    with ledger(ctx.obj) as engine:
        rows = durations(engine, since=window, job_type=job_type)
    if as_json:
        print_json({"window_seconds": window.total_seconds(), "types": [d.to_dict() for d in rows]})
        return
    columns = ["type", "count", "p50", "p95", "p99", "max"]
    cells = [[d.type, d.count, seconds(d.p50), seconds(d.p95), seconds(d.p99), seconds(d.max)] for d in rows]
    if any(d.spend for d in rows):  # AI extractions: what they cost
        columns += ["cost (USD)", "tokens in", "tokens out"]
        for row, d in zip(cells, rows, strict=True):
            row += [f"{d.spend.cost_usd:.4f}", d.spend.input_tokens, d.spend.output_tokens] if d.spend else ["", "", ""]
    table(f"Durations of jobs completed in the last {since}", columns, cells, empty="no jobs completed")
