"""``tether workers``: the worker processes on this ledger and the jobs each runs now."""

from __future__ import annotations

import typer

from ..config import DEFAULT_LOCK_TIMEOUT
from .app import JSON_OPTION, app, print_json
from .output import age, ledger, progress_text, table, when


@app.command()
def workers(
    ctx: typer.Context,
    lock_timeout: float = typer.Option(
        DEFAULT_LOCK_TIMEOUT, "--lock-timeout", help="Seconds without a heartbeat after which a worker is gone."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Each worker process: host, pid, threads, version, when it started and last beat, the
    jobs it runs now with their progress. A worker that stopped says so; one whose heartbeat
    stopped for the lock timeout is gone (it died or hangs: its jobs are given back).

    Example: tether workers --json
    """
    from ..observe.readonly import now_of
    from ..observe.workers import workers as registered

    with ledger(ctx.obj) as engine:
        now = now_of(engine, None)
        found = registered(engine, lock_timeout=lock_timeout, now=now)
    if as_json:
        print_json({"now": now.isoformat(), "lock_timeout": lock_timeout, "workers": [w.to_dict() for w in found]})
        return
    table(
        "Workers",
        ["state", "host", "pid", "threads", "version", "started (UTC)", "last beat", "running now"],
        [
            (
                w.state,
                w.host,
                w.pid,
                w.threads,
                w.version,
                when(w.started_at),
                f"{age((now - w.beat_at).total_seconds())} ago",
                "; ".join(f"{j.type} {j.id} {progress_text(j.progress)}".strip() for j in w.jobs) or "-",
            )
            for w in found
        ],
        empty="no worker has registered on this ledger",
    )
