"""``tether ui``: serve the web page over the ledger (needs the extra: pip install 'tether[ui]')."""

from __future__ import annotations

import socket

import typer

from .. import config, events
from ..errors import ConfigError
from .app import app, err, open_coordinator
from .reconcile import _require_existing


@app.command()
def ui(
    ctx: typer.Context,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on. Not loopback: --token-file is required."
    ),
    port: int = typer.Option(8787, "--port", help="Port to listen on."),
    allow_actions: bool = typer.Option(
        False, "--allow-actions", help="Enable retry and purge buttons (each confirmed, CSRF-checked, an event)."
    ),
    token_file: str | None = typer.Option(
        None, "--token-file", help="File holding the sign-in token (16+ characters): bearer header or login form."
    ),
    allowed_hosts: list[str] = typer.Option(
        [], "--allowed-host", help="Another Host name clients use (repeatable); required with --host 0.0.0.0."
    ),
    show_payloads: bool = typer.Option(
        False, "--show-payloads", help="Show job payloads (they may hold file contents or prompts)."
    ),
    backlog_limit: int = typer.Option(
        config.DEFAULT_BACKLOG_LIMIT, "--backlog-limit", envvar=config.ENV_BACKLOG_LIMIT, help="Backlog soft limit."
    ),
) -> None:
    """Serve the overview, jobs, failures, durations and drift as a web page (read-only by default).

    Binds to loopback unless told otherwise; any other address needs --token-file. Pages read
    the ledger through the same functions as the CLI's commands.

    Example: tether --db sqlite:///ledger/tether.db --root ./data ui --port 8787
    """
    try:
        import uvicorn

        from .. import ui as web
    except ImportError as e:
        raise ConfigError(f"tether ui needs its extra: pip install 'tether[ui]' ({e.name} is missing)") from e
    from ..observe.verdict import Thresholds

    token = web.read_token(token_file) if token_file else None
    hosts = web.bind_hosts(host, token, allowed_hosts)
    _require_existing(ctx.obj)  # a page never creates the ledger it shows
    with open_coordinator(ctx.obj) as coordinator:
        page = web.app(
            coordinator,
            allow_actions=allow_actions,
            show_payloads=show_payloads,
            token=token,
            allowed_hosts=hosts,
            thresholds=Thresholds(backlog_limit=backlog_limit),
        )
        # Bound before the banner: a busy port is one line and exit 1, and --port 0 prints the
        # port the system chose.
        listening = listen(host, port)
        where = f"[{host}]" if ":" in host else host
        mode = "actions enabled" if allow_actions else "read-only"
        err.print(f"tether ui: http://{where}:{listening.getsockname()[1]}/ ({mode}; Ctrl-C to stop)", markup=False)
        server = uvicorn.Server(uvicorn.Config(page, log_level="warning", server_header=False))
        # Actions and background checks are events on stderr, as every command whose stdout is
        # not its log prints them.
        with events.to_stderr(), listening:
            server.run(sockets=[listening])


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` and listening; ConfigError (one line) if it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host} port {port}: {e.strerror or e}; pick another with --port (0: any free one)"
        ) from e
    return sock
