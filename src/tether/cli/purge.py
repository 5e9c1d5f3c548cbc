"""``tether purge``: retention for finished jobs."""

from __future__ import annotations

import typer

from ..errors import ConfigError
from ..ledger.status import JobStatus
from .app import JSON_OPTION, app, out, print_json
from .output import ledger, parse_duration, table, when


@app.command()
def purge(
    ctx: typer.Context,
    older_than: str = typer.Option(
        ..., "--older-than", help="Delete jobs that finished longer ago than this, e.g. 7d, 12h."
    ),
    completed: bool = typer.Option(
        False, "--completed", help="Delete completed jobs (the latest per file/target is kept)."
    ),
    failed: bool = typer.Option(False, "--failed", help="Delete failed jobs."),
    cancelled: bool = typer.Option(False, "--cancelled", help="Delete cancelled jobs."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print what would be deleted."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Delete completed (and/or failed, cancelled) jobs that finished before a cutoff, with their attempts.

    Pending and claimed jobs are never touched; the latest completed job of each target (file
    path) is kept whatever its age, with its attempts, so reconcile can still prove that file
    and `tether history` still tells how it came to be.

    Example: tether purge --completed --older-than 7d --dry-run
    """
    from ..observe.retention import purge as purge_jobs

    chosen = ((JobStatus.COMPLETED, completed), (JobStatus.FAILED, failed), (JobStatus.CANCELLED, cancelled))
    statuses = [s for s, on in chosen if on]
    if not statuses:
        raise ConfigError("say what to purge: --completed, --failed and/or --cancelled")
    window = parse_duration(older_than, "--older-than")
    with ledger(ctx.obj) as engine:
        result = purge_jobs(engine, older_than=window, statuses=statuses, dry_run=dry_run)
    if as_json:
        print_json(result.to_dict())
        return
    verb = "would delete" if dry_run else "deleted"
    out.print(f"{verb} {result.total} job(s) that finished before {when(result.cutoff)} UTC", markup=False)
    table(
        None,
        ["status", "type", "jobs"],
        [(st, ty, n) for (st, ty), n in sorted(result.by_status_type.items())],
        empty="nothing to purge",
    )
