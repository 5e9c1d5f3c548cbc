"""``tether mcp``: serve the ledger's tools to an AI agent over stdio (the Model Context Protocol;
needs the extra: pip install 'tether[mcp]')."""

from __future__ import annotations

import typer

from .. import config, events
from ..errors import ConfigError
from .app import app, open_coordinator
from .output import ledger
from .reconcile import _require_existing


@app.command()
def mcp(
    ctx: typer.Context,
    allow_actions: bool = typer.Option(
        False, "--allow-actions", help="Add the retry, cancel and repair_apply tools (each needs confirm=true)."
    ),
    lock_timeout: float = typer.Option(
        config.DEFAULT_LOCK_TIMEOUT, "--lock-timeout", help="Seconds after which a claimed job's lock is stale."
    ),
) -> None:
    """A Model Context Protocol server on stdin/stdout: tools status, outstanding, failed,
    stuck, job, history, drift and spend, read through the same functions as the CLI's
    commands; no tool shows a payload. Read-only unless --allow-actions; every action is logged
    as an event (on stderr: stdout is the protocol's).

    Example: tether --db sqlite:///ledger/tether.db mcp   (an agent's configuration runs this command)
    """
    try:
        from mcp.server.mcpserver import MCPServer  # noqa: F401  (the extra's presence)

        from .. import toolserver
    except ImportError as e:
        raise ConfigError(f"tether mcp needs its extra: pip install 'tether[mcp]' ({e.name} is missing)") from e
    _require_existing(ctx.obj)  # an agent never creates the ledger it reads
    settings = ctx.obj
    with ledger(settings) as engine:
        opener = (lambda: open_coordinator(settings)) if allow_actions else None
        tools = toolserver.ToolServer(engine, opener, lock_timeout=lock_timeout)
        try:
            with events.to_stderr():
                toolserver.build(tools, allow_actions=allow_actions).run("stdio")
        finally:
            tools.close()
