"""``tether schedules``: the periodic jobs, their next and last runs; pause and resume."""

from __future__ import annotations

from typing import Any

import typer

from .app import JSON_OPTION, app, out, print_json
from .output import ledger, table, when

schedules_app = typer.Typer(
    help="Periodic jobs (declared in code): list them, pause or resume one.\n\nExample: tether schedules --json",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(schedules_app, name="schedules")


@schedules_app.callback()
def schedules(ctx: typer.Context, as_json: bool = JSON_OPTION) -> None:
    """List schedules: name, cron, timezone, next run, last run and its job's status, paused.

    A schedule is declared in code (coordinator.schedule, or a schedules(coordinator) function
    in an --import module); this lists what the ledger recorded. Its runs: tether jobs --schedule NAME.

    Example: tether schedules
    """
    if ctx.invoked_subcommand is not None:
        return
    from ..observe import schedules as schedule  # SQLAlchemy and cron: loaded when the command runs, not for --help

    with ledger(ctx.obj) as engine:
        rows = schedule.listing(engine)
    if as_json:
        print_json({"schedules": rows})
        return
    table(
        None,
        ["name", "cron", "timezone", "next run (UTC)", "last run (UTC)", "last status", "runs", "paused"],
        [
            (
                r["name"],
                r["cron"],
                r["timezone"],
                _next_run(r),
                when(r["last_run"]) if r["last_run"] else "never",
                r["last_status"] or ("purged" if r["last_job_id"] else "-"),
                f"{r['runs']}/{r['limit']}" if r["limit"] else str(r["runs"]),
                "yes" if r["paused"] else "no",
            )
            for r in rows
        ],
        empty="no schedules",
    )


def _next_run(row: dict[str, Any]) -> str:
    """A paused schedule has no next run: the slot it stopped at is past, and resume computes the
    next from then."""
    if row["paused"]:
        return "paused"
    return when(row["next_run"]) if row["next_run"] else "finished"


@schedules_app.command()
def pause(ctx: typer.Context, name: str = typer.Argument(..., help="The schedule's name.")) -> None:
    """Stop a schedule from enqueueing until it is resumed (its row and history stay).

    Example: tether schedules pause nightly-sync
    """
    from ..observe import schedules as schedule

    with ledger(ctx.obj) as engine:
        schedule.set_paused(engine, name, True)
    out.print(f"paused {name}")


@schedules_app.command()
def resume(ctx: typer.Context, name: str = typer.Argument(..., help="The schedule's name.")) -> None:
    """Let a paused schedule enqueue again, from its next slot after now (slots that fell while it
    was paused are skipped).

    Example: tether schedules resume nightly-sync
    """
    from ..observe import schedules as schedule

    with ledger(ctx.obj) as engine:
        result = schedule.set_paused(engine, name, False)
    nxt = result["next_run"]
    out.print(f"resumed {name}; next run {when(nxt) if nxt else 'none (finished)'}")
