"""``tether stuck``: claimed jobs whose lock has gone stale."""

from __future__ import annotations

import typer

from ..config import DEFAULT_LOCK_TIMEOUT
from .app import JSON_OPTION, app, print_json
from .output import LIMIT_HELP, age, ledger, limit_value, table, when


@app.command()
def stuck(
    ctx: typer.Context,
    lock_timeout: float = typer.Option(
        DEFAULT_LOCK_TIMEOUT, "--lock-timeout", help="Seconds after which a claimed job's lock is stale."
    ),
    limit: int = typer.Option(100, "--limit", "-n", help=LIMIT_HELP),
    as_json: bool = JSON_OPTION,
) -> None:
    """Claimed jobs whose lock is older than the lock timeout: who holds them, since when.

    A live worker renews its locks by heartbeat, so these belong to dead or hung workers;
    the stale-lock sweep of any running worker reclaims them.

    Example: tether stuck --lock-timeout 120
    """
    from ..observe.stuck import stuck

    n = limit_value(limit)
    with ledger(ctx.obj) as engine:
        found = stuck(engine, lock_timeout=lock_timeout, limit=n)
    if as_json:
        print_json(
            {
                "now": found.now.isoformat(),
                "lock_timeout": found.lock_timeout,
                "jobs": [{**j.to_dict(), "held_for": found.held_for(j)} for j in found.jobs],
            }
        )
        return
    table(
        f"Stuck jobs (lock older than {lock_timeout:g}s)",
        ["type", "id", "worker", "locked since (UTC)", "held for", "attempt"],
        [
            (j.type, j.id, j.locked_by, when(j.locked_at), age(found.held_for(j)), f"{j.attempts}/{j.max_attempts}")
            for j in found.jobs
        ],
        empty="no stuck jobs",
    )
