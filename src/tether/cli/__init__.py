"""The command line: a thin layer over the coordinator, one module per command.

Each command module imports at its top only typer and the light modules (config, errors,
events): what a command needs from the ledger (SQLAlchemy, the table model, the coordinator)
it imports when it runs, so ``tether --help`` starts without them."""

from __future__ import annotations

import sys

import typer

from ..errors import LedgerFault, TetherError
from ..ledger.faults import EXIT_LEDGER_FAULT, describe

# Importing a command module registers its command.
from . import (  # noqa: F401  (imported for the commands they register)
    cancel,
    drift,
    duplicates,
    durations,
    enqueue,
    failed,
    history,
    init,
    jobs,
    mcp,
    metrics,
    purge,
    recent,
    reconcile,
    repair,
    retry,
    schedules,
    show,
    status,
    stuck,
    ui,
    worker,
    workers,
)
from .app import app, err, is_database_error
from .pipe import quiet_closed_stdout


def main() -> None:
    """Console entry point: errors become one clear line and a non-zero exit, not a traceback:
    1 for bad input or an unreachable database, 74 (``faults.EXIT_LEDGER_FAULT``) when the ledger
    is corrupt, full, read-only or gone, 130 when interrupted; usage errors 2."""
    quiet_closed_stdout()
    try:
        # Without standalone mode, click returns (not raises) the exit code of typer.Exit and
        # of Ctrl-C (130).
        code = app(standalone_mode=False)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except LedgerFault as e:
        _fail(f"tether: ledger fault: {e}", EXIT_LEDGER_FAULT)
    except (TetherError, OSError) as e:
        _fail(f"tether: error: {e}", 1)
    except typer.TyperException as e:  # usage errors: typer bundles its own click
        display = getattr(e, "show", None)
        if display is None:
            raise
        display()
        sys.exit(getattr(e, "exit_code", 2))
    except Exception as e:
        if not is_database_error(e):  # a ledger fault was raised as LedgerFault by the app
            raise
        _fail(f"tether: error: {describe(e)}", 1)  # never the statement and its parameters
    if isinstance(code, int) and code:
        sys.exit(code)


def _fail(line: str, code: int) -> None:
    err.print(line, markup=False, soft_wrap=True)
    sys.exit(code)


__all__ = ["app", "main"]
