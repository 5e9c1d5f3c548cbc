"""``tether worker``: run jobs."""

from __future__ import annotations

from collections.abc import Mapping

import typer

from .. import events
from ..config import DEFAULT_LOCK_TIMEOUT, DEFAULT_SHUTDOWN_GRACE
from .app import app, err, open_coordinator


@app.command()
def worker(
    ctx: typer.Context,
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
    shutdown_grace: float = typer.Option(
        DEFAULT_SHUTDOWN_GRACE,
        "--shutdown-grace",
        min=0,
        help="Seconds running jobs get to finish after SIGINT/SIGTERM before they are cancelled and given back.",
    ),
    max_snoozes: int | None = typer.Option(
        None,
        "--max-snoozes",
        min=0,
        help="Snoozes a job may take before its next one fails it (default 100; WorkerConfig.max_snoozes).",
    ),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="Do not print lifecycle events (JSON lines on stdout, the worker's log)."
    ),
) -> None:
    """Run jobs until SIGINT/SIGTERM: the first stops claiming and gives running jobs
    --shutdown-grace seconds to finish; then, or at a second signal, they are cancelled at their
    next checkpoint (an AI assistant's process group is terminated) and their attempt is given back.

    Example: tether --root ./data worker --threads 4 --shutdown-grace 60
    """
    with events.to_stdout(not quiet), open_coordinator(ctx.obj, lock_timeout=lock_timeout) as coordinator:
        caps = {} if max_snoozes is None else {"max_snoozes": max_snoozes}
        w = coordinator.worker(threads=threads, poll_interval=poll_interval, shutdown_grace=shutdown_grace, **caps)
        w.on_unserved = _say_unserved
        w.run_until_idle() if until_idle else w.run()
    if not quiet:
        err.print(f"worker {w.id}: {summary(w.outcomes)}", markup=False)


def _say_unserved(unserved: Mapping[str, int]) -> None:
    """On stderr, whatever -q says, when the worker starts, stops or runs out of work: the pending
    jobs it cannot run, since it lacks their types (a worker without --import runs the built-in
    types only), and how to give it them."""
    err.print(f"tether worker: {unserved_text(unserved)}", markup=False, soft_wrap=True)


def unserved_text(unserved: Mapping[str, int]) -> str:
    """``2 pending jobs of types this worker does not have: stamp (start it with --import MODULE)``."""
    n = sum(unserved.values())
    jobs, types = ("job", "a type") if n == 1 else ("jobs", "types")
    names = ", ".join(unserved)
    return f"{n} pending {jobs} of {types} this worker does not have: {names} (start it with --import MODULE)"


_OUTCOMES = (
    ("complete", "completed"),
    ("retry", "to retry"),
    ("fail", "failed"),
    ("release", "given back"),
    ("snooze", "snoozed"),  # a handler's Snooze, or a full data root
    ("defer", "snoozed with their type"),
)


def summary(outcomes: Mapping[str, int]) -> str:
    """What the handlers that ran came to: ``2 completed, 1 given back`` (a job given back at
    shutdown did not run to its end, so it is not counted as run)."""
    parts = [f"{outcomes[edge]} {label}" for edge, label in _OUTCOMES if outcomes.get(edge)]
    return ", ".join(parts) if parts else "no jobs run"
