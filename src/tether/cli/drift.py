"""``tether drift``: the last reconcile run's findings, read from the ledger (no disk is read);
``--target`` tells when a target first and last drifted; ``drift accept`` takes what is there
as a target's expected state."""

from __future__ import annotations

import typer

from .app import JSON_OPTION, app, open_coordinator, out, print_json
from .output import ledger

drift_app = typer.Typer(
    help="What the last reconcile run found, and accepting drift.\n\nExample: tether drift --target people/ada.json",
    invoke_without_command=True,
    rich_markup_mode=None,
)
app.add_typer(drift_app, name="drift")


@drift_app.callback()
def drift(
    ctx: typer.Context,
    target: str | None = typer.Option(
        None, "--target", help="When this target (a path as reconcile shows it) first and last drifted."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show the last reconcile run's findings as recorded (without reading the disk), or with
    --target one target's first and last drift among the kept runs (TETHER_DRIFT_RUNS, default 10).

    Example: tether drift --json
    """
    if ctx.invoked_subcommand is not None:
        return
    from ..reconcile import findings

    with ledger(ctx.obj) as engine:
        if target is not None:
            seen = findings.for_target(engine, target)
            _show_target(seen, as_json=as_json)
            return
        last = findings.last_run(engine)
    if as_json:
        print_json(None if last is None else last.__dict__)
        return
    if last is None:
        out.print("no reconcile run recorded: run `tether reconcile`")
        return
    _show_last(last)


def _show_last(last: object) -> None:
    from ..reconcile.findings import LastRun
    from .plan_table import print_ignored, table

    assert isinstance(last, LastRun)
    when = last.checked_at.isoformat()
    out.print(f"last run {last.run_id} at {when}: exit {last.exit_code}, {len(last.findings)} finding(s)")
    if last.findings:
        shown = table("status", "path", "job", "detail")
        for f in last.findings:
            shown.add_row(f["status"], f["path"], f.get("job_id") or "-", f.get("detail") or "")
        out.print(shown)
    print_ignored((f["path"], f["status"], f["rule"]) for f in last.ignored)


def _show_target(seen: object, *, as_json: bool) -> None:
    from ..reconcile.findings import TargetDrift

    assert isinstance(seen, TargetDrift)
    if as_json:
        print_json(seen.__dict__)
        return
    if seen.first_drift is None:
        out.print(f"{seen.target}: no drift in the {seen.runs_kept} kept run(s)")
        return
    assert seen.last_drift is not None
    out.print(
        f"{seen.target}: drifted in {seen.drifted_runs} of {seen.runs_kept} kept run(s); "
        f"first {seen.first_drift.isoformat()}, last {seen.last_drift.isoformat()} ({seen.last_status})"
    )


@drift_app.command("accept")
def accept(
    ctx: typer.Context,
    targets: list[str] = typer.Argument(
        ..., metavar="TARGET...", help="Paths (or AWS targets as reconcile shows them)."
    ),
    reason: str | None = typer.Option(
        None, "--reason", help="Why: kept with the record, shown in the target's history."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Accept what each target holds now as its expected state: a completed `adopt` record (no
    effect) holding a file's size and hash, or an AWS resource's declared fields as they are, so
    the next reconcile reads it in sync. Refused while a job on the target is pending or claimed.

    Example: tether drift accept people/ada.json --reason "fixed by hand during the outage"
    """
    with open_coordinator(ctx.obj) as coordinator:
        done = coordinator.accept(targets, reason=reason)
    if as_json:
        print_json({"accepted": [job.to_dict(include_payload=True) for job in done]})
        return
    for job in done:
        out.print(f"accepted {job.ordering_key} as {job.id}")
