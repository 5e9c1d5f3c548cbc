"""``tether metrics``: the ledger's numbers in Prometheus text format."""

from __future__ import annotations

import sys

import typer

from ..config import DEFAULT_BACKLOG_LIMIT, DEFAULT_LOCK_TIMEOUT, ENV_BACKLOG_LIMIT
from .app import app
from .output import ledger, parse_duration


@app.command()
def metrics(
    lock_timeout: float = typer.Option(
        DEFAULT_LOCK_TIMEOUT, "--lock-timeout", help="Seconds after which a claimed job counts as stuck."
    ),
    window: str = typer.Option("1h", "--window", help="Window of the duration summary, e.g. 5m, 1h."),
    backlog_limit: int = typer.Option(
        DEFAULT_BACKLOG_LIMIT,
        "--backlog-limit",
        envvar=ENV_BACKLOG_LIMIT,
        help="Backlog soft limit used for tether_health.",
    ),
) -> None:
    """Print the ledger's numbers in Prometheus text format.

    Jobs by status and type, outstanding, failed, stuck, oldest pending age, health, and a
    summary of durations over --window (for node_exporter's textfile collector, or a scraper).

    Example: tether --db sqlite:///ledger/tether.db metrics --window 15m
    """
    from ..health import Thresholds
    from ..metrics import exposition  # prometheus-client is loaded by this command only

    span = parse_duration(window, "--window")
    with ledger() as engine:
        text = exposition(
            engine, lock_timeout=lock_timeout, window=span, thresholds=Thresholds(backlog_limit=backlog_limit)
        )
    sys.stdout.write(text.decode())
    sys.stdout.flush()
