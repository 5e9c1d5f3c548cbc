"""``tether retry``: put failed jobs back to pending, or retry one with a corrected payload."""

from __future__ import annotations

from typing import Any

import typer

from ..errors import ConfigError, TetherError
from .app import JSON_OPTION, app, err, open_coordinator, out, print_json
from .output import ledger, table


@app.command()
def retry(
    ctx: typer.Context,
    # typer < 0.28 (pinned: pyproject.toml) prints a metavar as given: "..." says several may be given.
    job_ids: list[str] | None = typer.Argument(None, metavar="[ID]...", help="Ids of failed jobs to retry."),
    all_failed: bool = typer.Option(False, "--failed", help="Retry every failed job (with --type: of that type)."),
    job_type: str | None = typer.Option(None, "--type", "-t", help="With --failed: only jobs of this type."),
    payload: str | None = typer.Option(
        None,
        "--payload",
        help="With one ID: a corrected payload (JSON, or @file.json). A new job retries the failed one "
        "(retry_of), which stays as it was, as evidence.",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Put failed jobs back to pending, attempts reset (by id, or all with --failed).

    Only failed jobs can be retried, and never while another active job holds the same key.
    Exits 1 if any job could not be retried (the others still are).

    Example: tether retry --failed --type create_file

    Example: tether retry 01JD3X9Q8ZK2M4N5P6R7S8T9V0 --payload @fixed.json
    """
    from ..observe.finished import failed

    if bool(job_ids) == all_failed:
        raise ConfigError("give job ids or --failed (not both, not neither)")
    if job_type and not all_failed:
        raise ConfigError("--type only applies with --failed")
    if payload is not None and len(job_ids or []) != 1:
        raise ConfigError("--payload needs exactly one job id")
    with ledger(ctx.obj) as engine:  # a missing ledger is an error here, never created
        ids = job_ids or [j.id for j in failed(engine, job_type=job_type, limit=None)]
    retried, errors = [], []
    with open_coordinator(ctx.obj) as coordinator:
        for job_id in ids:
            try:
                retried.append(coordinator.retry(job_id, _corrected(coordinator, job_id, payload)))
            except TetherError as e:
                errors.append({"id": job_id, "error": str(e)})
    if as_json:
        print_json({"retried": [j.to_dict() for j in retried], "errors": errors})
    else:
        if retried or not errors:
            table(
                None,
                ["retried", "type", "status"],
                [(j.id, j.type, j.status.value) for j in retried],
                empty="no failed jobs to retry",
            )
        for failure in errors:
            err.print(f"tether: error: {failure['error']}", markup=False, soft_wrap=True)
        if retried and payload is not None:
            out.print(f"job {retried[0].id} retries {ids[0]} with the corrected payload; run a worker to process it")
        elif retried:
            out.print(f"{len(retried)} job(s) back to pending; run a worker to process them")
    if errors:
        raise typer.Exit(1)


def _corrected(coordinator: Any, job_id: str, payload: str | None) -> Any:
    """The corrected payload given for ``job_id``, parsed and validated as its type's (None: none)."""
    if payload is None:
        return None
    from .enqueue import load_payload

    job_type = coordinator.get(job_id).type
    return coordinator.registry.parse(job_type, load_payload(job_type, payload))
