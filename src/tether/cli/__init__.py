"""The command line: a thin layer over the coordinator, one module per command."""

from __future__ import annotations

import sys

import sqlalchemy as sa
import typer

from ..errors import TetherError
from . import enqueue, worker  # noqa: F401  (registers the commands)
from . import reconcile  # noqa: F401  (registers the command)
from . import status  # noqa: F401
from . import failed  # noqa: F401
from . import stuck  # noqa: F401
from . import durations  # noqa: F401
from . import duplicates  # noqa: F401
from . import recent  # noqa: F401
from . import jobs  # noqa: F401
from . import show  # noqa: F401
from . import retry  # noqa: F401
from . import purge  # noqa: F401
from . import metrics  # noqa: F401
from .app import app, err


def main() -> None:
    """Console entry point: errors become one clear line and a non-zero exit, not a traceback."""
    try:
        app(standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(130)
    except (TetherError, sa.exc.SQLAlchemyError, OSError) as e:
        err.print(f"tether: error: {e}", markup=False, soft_wrap=True)
        sys.exit(1)
    except typer.BadParameter as e:  # click exceptions
        e.show()
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors and the like
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(e.exit_code)
        raise


__all__ = ["app", "main"]
