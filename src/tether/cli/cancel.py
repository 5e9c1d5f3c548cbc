"""``tether cancel``: cancel jobs by id, type or key (a pending job at once, a running one by its
worker); ``tether pause`` / ``tether resume``: stop and restart every worker's claims of a type."""

from __future__ import annotations

import typer

from .app import JSON_OPTION, app, err, open_coordinator, out, print_json
from .output import table


@app.command()
def cancel(
    ctx: typer.Context,
    # typer < 0.28 (pinned: pyproject.toml) prints a metavar as given: "..." says several may be given.
    job_ids: list[str] | None = typer.Argument(None, metavar="[ID]...", help="Ids of jobs to cancel."),
    job_type: str | None = typer.Option(None, "--type", "-t", help="Cancel every active job of this type."),
    key: str | None = typer.Option(None, "--key", "-k", help="Cancel every active job with this idempotency key."),
    tag: str | None = typer.Option(None, "--tag", help="Cancel every active job carrying this tag."),
    reason: str | None = typer.Option(None, "--reason", help="Why, for the job's record (shown by show, failed)."),
    wait: float = typer.Option(
        5.0, "--wait", help="Seconds to wait for the workers of running jobs to stop them and record the effect."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Cancel jobs: a pending job is cancelled at once; a running one is stopped by its worker
    (on any machine, within a second) and recorded cancelled with whether its effect landed
    (effect: landed, absent or unknown, by its type's reconcile probe). A finished job is
    refused. Exits 1 if any job could not be cancelled (the others still are).

    Example: tether cancel --type claude_extraction --reason "wrong prompt"

    Example: tether cancel --tag tenant:acme
    """
    with open_coordinator(ctx.obj) as coordinator:
        results = coordinator.cancel(*(job_ids or ()), job_type=job_type, key=key, tag=tag, reason=reason, wait=wait)
    refused = [r for r in results if r.outcome == "refused"]
    if as_json:
        print_json(
            {
                "cancelled": [
                    {"id": r.job_id, "outcome": r.outcome, "effect": r.effect, "type": r.job.type if r.job else None}
                    for r in results
                    if r.outcome != "refused"
                ],
                "errors": [{"id": r.job_id, "error": r.error} for r in refused],
            }
        )
    else:
        done = [r for r in results if r.outcome != "refused"]
        if done or not refused:
            rows = [(r.job_id, r.job.type if r.job else "", r.outcome, r.effect or "") for r in done]
            table(None, ["job", "type", "outcome", "effect"], rows, empty="no active jobs to cancel")
        for r in refused:
            err.print(f"tether: error: {r.error}", markup=False, soft_wrap=True)
        if any(r.outcome == "requested" for r in done):
            out.print("requested: the worker running it has not recorded the cancel yet (tether show ID)")
    if refused:
        raise typer.Exit(1)


@app.command()
def pause(
    ctx: typer.Context,
    job_type: str = typer.Argument(..., metavar="TYPE", help="The job type no worker is to claim."),
    reason: str | None = typer.Option(None, "--reason", help="Why, shown by status, jobs and the ui."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Pause a job type: every worker, on any machine, stops claiming its jobs within a second;
    its running jobs finish. Its waiting jobs stay pending (status shows them as paused).

    Example: tether pause claude_extraction --reason "API quota"
    """
    with open_coordinator(ctx.obj) as coordinator:
        paused = coordinator.pause(job_type, reason)
    if as_json:
        print_json({"paused": paused.job_type, "reason": paused.reason, "paused_at": paused.paused_at})
    else:
        out.print(f"{paused.job_type} paused: no worker claims its jobs; tether resume {paused.job_type} to go on")


@app.command()
def resume(
    ctx: typer.Context,
    job_type: str = typer.Argument(..., metavar="TYPE", help="The paused job type."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Resume a paused job type: workers claim its jobs again.

    Example: tether resume claude_extraction
    """
    with open_coordinator(ctx.obj) as coordinator:
        resumed = coordinator.resume(job_type)
    if as_json:
        print_json({"resumed": job_type, "was_paused": resumed})
    else:
        out.print(f"{job_type} resumed" if resumed else f"{job_type} was not paused")
