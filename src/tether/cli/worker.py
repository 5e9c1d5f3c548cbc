"""``tether worker``: run jobs."""

from __future__ import annotations

from collections.abc import Mapping

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
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Do not print lifecycle events (JSON lines on stdout, the worker's log)."
    ),
) -> None:
    """Run jobs until SIGINT/SIGTERM (the current job finishes; a second signal cancels it at
    its next checkpoint and gives the attempt back).

    Example: tether --root ./data worker --threads 4
    """
    with events.to_stdout(not quiet), open_coordinator(lock_timeout=lock_timeout) as coordinator:
        w = coordinator.worker(threads=threads, poll_interval=poll_interval)
        w.run_until_idle() if until_idle else w.run()
    if not quiet:
        err.print(f"worker {w.id}: {summary(w.outcomes)}", markup=False)


_OUTCOMES = (("complete", "completed"), ("retry", "to retry"), ("fail", "failed"), ("release", "given back"))


def summary(outcomes: Mapping[str, int]) -> str:
    """What the handlers that ran came to: ``2 completed, 1 given back`` (a job given back at
    shutdown did not run to its end, so it is not counted as run)."""
    parts = [f"{outcomes[edge]} {label}" for edge, label in _OUTCOMES if outcomes.get(edge)]
    return ", ".join(parts) if parts else "no jobs run"
