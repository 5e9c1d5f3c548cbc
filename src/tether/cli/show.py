"""``tether show``: everything about one job."""

from __future__ import annotations

import orjson
import typer

from .app import JSON_OPTION, app, out, print_json
from .output import ledger, progress_text, when


@app.command()
def show(
    ctx: typer.Context,
    job_id: str = typer.Argument(
        ...,
        metavar="ID",
        help="The job id as printed by enqueue or jobs, or any unique prefix or suffix of it (any case).",
    ),
    payload: bool = typer.Option(
        False, "--payload", help="Also print the payload (it may hold file contents or prompts)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Everything about one job: every column, the whole last error, result, children.

    Example: tether show 01JD3X9Q8ZK2M4N5P6R7S8T9V0 --payload   (or: tether show s8t9v0)
    """
    from rich.table import Table

    from ..observe.jobs import cancel_requested, children, resolve_id, show
    from ..observe.tags import notes

    with ledger(ctx.obj) as engine:
        job_id = resolve_id(engine, job_id)
        job = show(engine, job_id)
        kids = children(engine, job_id)
        noted = notes(engine, [job_id])[job_id]
        cancelling = cancel_requested(engine, job_id)
    if as_json:
        told = {**job.to_dict(include_payload=payload), **noted, "cancel_requested": cancelling}
        print_json({**told, "children": [k.id for k in kids]})
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    times = {"locked_at", "created_at", "claimed_at", "completed_at", "run_at"}
    for name, value in job.to_dict().items():
        if name in ("last_error", "result"):
            continue
        if name == "progress":
            value = progress_text(job.progress) or None
        if name in times and value:
            value = when(getattr(job, name)) + " UTC"
        grid.add_row(name, "" if value is None else str(value))
    grid.add_row("children", " ".join(k.id for k in kids) or "")
    grid.add_row("tags", " ".join(noted["tags"]))
    grid.add_row("meta", "" if noted["meta"] is None else orjson.dumps(noted["meta"]).decode())
    grid.add_row("retry_of", noted["retry_of"] or "")
    grid.add_row("retried_as", " ".join(noted["retried_as"]))
    if cancelling is not None:  # the worker stops it at its next checkpoint
        grid.add_row("cancel requested", cancelling)
    out.print(grid)
    if job.result is not None:
        out.print("[bold]result[/]")
        out.print(orjson.dumps(job.result_data, option=orjson.OPT_INDENT_2).decode(), markup=False, highlight=False)
    if job.last_error:
        out.print("[bold]last error[/]")
        out.print(job.last_error, markup=False, highlight=False)
    if payload:
        out.print("[bold]payload[/]")
        out.print(orjson.dumps(job.payload_data, option=orjson.OPT_INDENT_2).decode(), markup=False, highlight=False)
