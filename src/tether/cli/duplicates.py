"""``tether duplicates``: idempotency keys used by more than one job."""

from __future__ import annotations

from collections import Counter

import typer

from .app import JSON_OPTION, app, print_json
from .output import ledger, limit_value, table


@app.command()
def duplicates(
    ctx: typer.Context,
    job_type: str | None = typer.Option(None, "--type", "-t", help="Only keys of this type."),
    limit: int = typer.Option(50, "--limit", "-n", help="Show at most this many keys (0 for all)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Idempotency keys used by more than one job of a type, with their statuses.

    Two active jobs can never share a key; these are re-runs after a job completed or failed.

    Example: tether duplicates --type create_file --json
    """
    from ..observe.duplicates import duplicates

    n = limit_value(limit)
    with ledger(ctx.obj) as engine:
        groups = duplicates(engine, job_type=job_type, limit=n)
    if as_json:
        print_json({"keys": [g.to_dict() for g in groups]})
        return
    rows = []
    for g in groups:
        by_status = Counter(j.status.value for j in g.jobs)
        rows.append(
            (
                g.type,
                g.idempotency_key,
                len(g.jobs),
                ", ".join(f"{n} {s}" for s, n in sorted(by_status.items())),
                " ".join(j.id for j in g.jobs[-3:]) + (" …" if len(g.jobs) > 3 else ""),
            )
        )
    table(
        "Keys used by more than one job",
        ["type", "key", "jobs", "statuses", "latest ids"],
        rows,
        empty="no duplicate keys",
    )
