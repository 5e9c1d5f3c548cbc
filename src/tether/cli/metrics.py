"""``tether metrics``: the ledger's numbers in Prometheus text format, printed once or served."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

import typer

from ..config import DEFAULT_BACKLOG_LIMIT, DEFAULT_LOCK_TIMEOUT, ENV_BACKLOG_LIMIT
from .app import Settings, app, err
from .output import ledger, parse_duration

if TYPE_CHECKING:
    from ..observe.verdict import Thresholds


@app.command()
def metrics(
    ctx: typer.Context,
    lock_timeout: float = typer.Option(
        DEFAULT_LOCK_TIMEOUT, "--lock-timeout", help="Seconds after which a claimed job counts as stuck."
    ),
    window: str = typer.Option(
        "1h", "--window", help="Printed once: count jobs finished in this window, e.g. 5m, 1h (not with --serve)."
    ),
    backlog_limit: int = typer.Option(
        DEFAULT_BACKLOG_LIMIT,
        "--backlog-limit",
        envvar=ENV_BACKLOG_LIMIT,
        help="Backlog soft limit used for tether_health.",
    ),
    serve: bool = typer.Option(False, "--serve", help="Answer Prometheus scrapes over HTTP at /metrics until stopped."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (--serve); loopback unless --allow-remote."
    ),
    port: int = typer.Option(9464, "--port", help="Port to listen on (--serve)."),
    exact: bool = typer.Option(
        False, "--exact", help="Printed once: read every job of the --window, not a sample (not with --serve)."
    ),
    allow_remote: bool = typer.Option(
        False, "--allow-remote", help="Allow --host to be an address other machines can reach."
    ),
) -> None:
    """The ledger's numbers in Prometheus text format.

    Jobs waiting, running and failed by type; outstanding, stuck, oldest pending age, health;
    jobs finished by outcome and type with histograms of run time, queue wait and attempts; the
    last reconcile verdict. Printed once (for node_exporter's textfile collector: the finished
    jobs are those of the last --window; a busy window is read on a sample of each outcome,
    which tether_jobs_finished_sample_every states, unless --exact), or served with --serve
    (counters from the server's start, exact, plus the process's own metrics). Scrape config and
    alert rules: docs/prometheus.md.

    Example: tether --db sqlite:///ledger/tether.db metrics --serve --port 9464
    """
    from ..observe import metrics as m  # prometheus-client is loaded by this command only
    from ..observe.verdict import Thresholds

    thresholds = Thresholds(backlog_limit=backlog_limit)
    if not serve:
        span = parse_duration(window, "--window")
        with ledger(ctx.obj) as engine:
            sample = None if exact else m.SAMPLE
            text = m.exposition(engine, lock_timeout=lock_timeout, window=span, thresholds=thresholds, sample=sample)
        sys.stdout.write(text.decode())
        sys.stdout.flush()
        return
    _serve(ctx.obj, host, port, allow_remote=allow_remote, lock_timeout=lock_timeout, thresholds=thresholds)


def _serve(
    settings: Settings, host: str, port: int, *, allow_remote: bool, lock_timeout: float, thresholds: Thresholds
) -> None:
    """Answer scrapes until Ctrl-C or SIGTERM."""
    from ..observe import metrics as m

    with ledger(settings) as engine:
        server, thread = m.serve(
            engine, host, port, allow_remote=allow_remote, lock_timeout=lock_timeout, thresholds=thresholds
        )
        where = f"[{host}]" if ":" in host else host
        err.print(f"tether metrics: serving http://{where}:{server.server_port}/metrics (Ctrl-C to stop)", markup=False)
        # SIGTERM (a service manager's stop) ends the server as Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            while thread.is_alive():
                thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
