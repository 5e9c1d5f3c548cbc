"""``tether history``: every job that touched one target and every attempt of each, in time order."""

from __future__ import annotations

import typer

from .app import JSON_OPTION, app, out, print_json
from .output import LIMIT_HELP, ledger, limit_value, seconds, table, when


@app.command()
def history(
    ctx: typer.Context,
    target: str = typer.Argument(
        ...,
        metavar="TARGET",
        help="A data path (notes/a.json), an AWS resource (s3_bucket:eu-west-1:logs), or an ordering key.",
    ),
    limit: int = typer.Option(50, "--limit", help=LIMIT_HELP),
    as_json: bool = JSON_OPTION,
) -> None:
    """A target's whole history: each job that touched it, and within each job every attempt
    (start, end, worker, outcome: completed, error with its first line, timeout, reclaimed after
    a dead worker, given back, cancelled), with operators' retries, the repairs applied, the
    accepts with their reasons and the drift the kept reconcile runs found, in time order. The newest
    --limit jobs are shown.

    Example: tether history notes/a.json   (or: tether history s3_bucket:eu-west-1:logs --json)
    """
    from ..observe.history import ATTEMPT, history

    with ledger(ctx.obj) as engine:
        found = history(engine, target, limit=limit_value(limit))
    if as_json:
        print_json(found.to_dict())
        return
    out.print(f"history of {found.target} ({found.key})", markup=False)
    if found.more:
        out.print(f"older jobs on it are left out: --limit {limit} shows the newest {limit}", markup=False)
    rows = []
    for e in found.entries:
        took = seconds((e.ended_at - e.at).total_seconds()) if e.ended_at is not None and e.kind == ATTEMPT else ""
        attempt = "" if e.attempt is None or e.kind != ATTEMPT else e.attempt
        rows.append((when(e.at), e.job_id, e.job_type, e.event, attempt, e.worker, took, e.detail))
    table(None, ["time (UTC)", "job", "type", "event", "attempt", "worker", "took", "detail"], rows)
