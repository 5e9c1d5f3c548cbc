"""``tether repair apply``: enqueue an approved repair plan (``tether reconcile --plan --out``)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ConfigError
from .app import JSON_OPTION, app, open_coordinator, out, print_json

repair_app = typer.Typer(
    help="Act on a repair plan made by `tether reconcile --plan --out FILE`.\n\nExample: tether repair apply plan.json",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(repair_app, name="repair")


@repair_app.command("apply")
def apply(
    ctx: typer.Context,
    plan_file: Path = typer.Argument(..., metavar="PLAN", help="The plan file `tether reconcile --plan --out` wrote."),
    only: list[str] = typer.Option(
        [], "--only", help="Apply only this target's job (a path as the plan shows it; repeatable)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Enqueue exactly the plan's jobs, in one transaction, after checking that no planned target
    has had a job since the plan was made. A stale plan is refused, naming those targets, and
    nothing is enqueued (exit 1): make a new plan. Run a worker to carry the jobs out.

    Example: tether repair apply plan.json --only people/ada.json
    """
    from ..reconcile.plan import Plan

    try:
        text = plan_file.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the plan {plan_file}: {e.strerror or e}") from e
    plan = Plan.from_json(text, str(plan_file))
    with open_coordinator(ctx.obj) as coordinator:
        results = coordinator.apply_repairs(plan, only=only)
    if as_json:
        print_json({"enqueued": [r.job.to_dict() for r in results]})
        return
    for r in results:
        out.print(f"enqueued {r.job.id} {r.job.type} on {r.job.ordering_key}")
    out.print(f"{len(results)} repair job(s) enqueued; run a worker to carry them out, then reconcile")
