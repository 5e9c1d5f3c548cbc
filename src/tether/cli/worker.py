"""``tether worker``: run jobs."""

from __future__ import annotations

import typer

from .. import events
from ..config import DEFAULT_LOCK_TIMEOUT
from .app import app, err, open_coordinator


@app.command()
def worker(
    until_idle: bool = typer.Option(False, "--until-idle", help="Sweep stale locks, run every ready job, then exit 0."),
    threads: int = typer.Option(1, "--threads", min=1, help="Threads claiming jobs independently."),
    poll_interval: float = typer.Option(
        1.0,
        "--poll-interval",
        min=0.001,
        help="Seconds between polls when idle (enqueues in this process wake it at once).",
    ),
    lock_timeout: float = typer.Option(
        DEFAULT_LOCK_TIMEOUT,
        "--lock-timeout",
        min=0.001,
        help="Seconds after which a claimed job without heartbeat is reclaimed.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not print lifecycle events (JSON lines on stderr)."),
) -> None:
    """Run jobs until SIGINT/SIGTERM (the current job finishes; a second signal cancels it at
    its next checkpoint and gives the attempt back).

    Example: tether --root ./data worker --threads 4
    """
    with events.to_stderr(not quiet), open_coordinator(lock_timeout=lock_timeout) as coordinator:
        w = coordinator.worker(threads=threads, poll_interval=poll_interval)
        ran = w.run_until_idle() if until_idle else w.run()
    if not quiet:
        err.print(f"worker {w.id} ran {ran} job(s)")
