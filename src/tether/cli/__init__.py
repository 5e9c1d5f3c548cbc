"""The command line: a thin layer over the coordinator, one module per command."""

from __future__ import annotations

import sys

import sqlalchemy as sa
import typer

from ..errors import TetherError

# Importing a command module registers its command.
from . import (  # noqa: F401  (imported for the commands they register)
    duplicates,
    durations,
    enqueue,
    failed,
    jobs,
    metrics,
    purge,
    recent,
    reconcile,
    retry,
    show,
    status,
    stuck,
    worker,
)
from .app import app, err


def main() -> None:
    """Console entry point: errors become one clear line and a non-zero exit, not a traceback."""
    try:
        # Without standalone mode, click returns (not raises) the exit code of typer.Exit and
        # of Ctrl-C (130).
        code = app(standalone_mode=False)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except (TetherError, sa.exc.SQLAlchemyError, OSError) as e:
        err.print(f"tether: error: {e}", markup=False, soft_wrap=True)
        sys.exit(1)
    except typer.TyperException as e:  # usage errors: typer bundles its own click
        display = getattr(e, "show", None)
        if display is None:
            raise
        display()
        sys.exit(getattr(e, "exit_code", 2))
    if isinstance(code, int) and code:
        sys.exit(code)


__all__ = ["app", "main"]
