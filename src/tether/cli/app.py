"""The typer app, its global options, and how every command opens the ledger and prints."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import orjson
import typer
from rich.console import Console
from typer.core import TyperGroup

from .. import config
from ..errors import ConfigError, LedgerFault, TetherError
from ..ledger.faults import ledger_fault
from ..ledger.lifecycle import error_text

if TYPE_CHECKING:
    from ..coordinator import Coordinator


@dataclass(frozen=True)
class Settings:
    """The global options of one invocation. The app's callback puts them on the click context
    (``ctx.obj``), and each command passes them on to what opens the ledger."""

    db: str | None = None
    root: str | None = None
    imports: tuple[str, ...] = ()
    durability: str | None = None
    schema: str | None = None
    moved: bool = False


class _Commands(TyperGroup):
    """tether's command group. A database error that escapes a command becomes, when it is a
    ledger fault (corrupt, full, read-only, gone), the LedgerFault naming this invocation's ledger:
    only the group knows which ledger that is."""

    def invoke(self, ctx: Any) -> Any:  # click's Context: the click package's or typer's own, by version
        try:
            return super().invoke(ctx)
        except Exception as e:
            settings = ctx.find_object(Settings)
            fault = None if settings is None or not is_database_error(e) else _ledger_fault(e, settings)
            if fault is None:
                raise
            raise fault from e


def is_database_error(error: BaseException) -> bool:
    """A SQLAlchemy error (without importing SQLAlchemy when no command loaded it)."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    return sa_exc is not None and isinstance(error, sa_exc.SQLAlchemyError)


def _ledger_fault(error: BaseException, settings: Settings) -> LedgerFault | None:
    from ..ledger.url import mask_url

    return ledger_fault(error, mask_url(config.db_url(settings.db)))


app = typer.Typer(
    cls=_Commands,
    name="tether",
    help="Durable jobs for JSON-file data stores: enqueue, run, reconcile, inspect.\n\n"
    "Example: tether --db sqlite:///tether.db --root ./data worker --until-idle",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: paragraphs rewrapped to the terminal, no `<bool>` after flags, and no
    # rich import for --help.
    rich_markup_mode=None,
)

# Piped output keeps whole table rows (rich would wrap them at 80 columns).
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 200)


@app.callback()
def _global(
    ctx: typer.Context,
    db: str | None = typer.Option(
        None,
        "--db",
        envvar=config.ENV_DB,
        help="SQLAlchemy URL of the ledger (default sqlite:///tether.db in the working directory).",
    ),
    root: str | None = typer.Option(
        None,
        "--root",
        envvar=config.ENV_ROOT,
        help="The data root all payload paths are relative to (default: the one the ledger recorded "
        "when it was created; a new ledger: the working directory).",
    ),
    moved: bool = typer.Option(
        False,
        "--moved",
        help="The data moved: record --root as the ledger's new data root instead of refusing it.",
    ),
    imports: list[str] = typer.Option(
        [],
        "--import",
        "-i",
        envvar=config.ENV_IMPORT,
        help="Python module that registers your own job types (repeatable).",
    ),
    schema: str | None = typer.Option(
        None,
        "--schema",
        envvar=config.ENV_SCHEMA,
        help="PostgreSQL schema holding the ledger, for a database shared with other applications.",
    ),
    durability: str | None = typer.Option(
        None,
        "--durability",
        envvar=config.ENV_DURABILITY,
        help="SQLite commit durability: 'full' (default; survives power loss) "
        "or 'normal' (may lose the last commits on power loss).",
    ),
) -> None:
    ctx.obj = Settings(db, root, tuple(imports), durability, schema, moved)


def open_coordinator(settings: Settings, **kwargs: Any) -> Coordinator:
    """The ledger named by --db/--root, with the job types of every --import module. It must
    exist: only ``tether init`` creates one (``create=True``), so a mistyped --db is an error."""
    from ..coordinator import Coordinator
    from ..jobtypes import default_registry

    registry = default_registry()
    modules = [register_module(module, registry) for module in settings.imports]
    kwargs.setdefault("durability", settings.durability)
    kwargs.setdefault("schema", settings.schema)
    kwargs.setdefault("moved", settings.moved)
    kwargs.setdefault("create", False)
    coordinator = Coordinator.open(settings.db, root=settings.root, registry=registry, **kwargs)
    try:
        for name, mod in zip(settings.imports, modules, strict=True):
            declare_schedules(name, mod, coordinator)
    except BaseException:
        coordinator.close()
        raise
    return coordinator


def declare_schedules(name: str, module: Any, coordinator: Coordinator) -> None:
    """An --import module's optional ``schedules(coordinator)``: it declares periodic jobs with
    ``coordinator.schedule(...)`` (after register(registry), so their job types are known)."""
    declare = getattr(module, "schedules", None)
    if not callable(declare) or isinstance(declare, ModuleType):  # a submodule named schedules is not the hook
        return
    try:
        declare(coordinator)
    except TetherError as e:
        raise ConfigError(f"--import {name}: its schedules(coordinator) failed: {e}") from e
    except Exception as e:
        raise ConfigError(f"--import {name}: its schedules(coordinator) raised {_one_line(e)}") from e


def register_module(module: str, registry: Any) -> Any:
    """Import ``module`` (the working directory first on ``sys.path``, as ``python -m`` puts it)
    and call its ``register(registry)``; any failure is a ConfigError naming the module."""
    import importlib

    if "," in module:  # TETHER_IMPORT="a,b" arrives as one name
        raise ConfigError(f"--import {module}: separate module names with spaces (TETHER_IMPORT='a b'), not commas")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # not found, a syntax error, or an error raised while it loads
        raise ConfigError(f"--import {module}: cannot import it: {_one_line(e)}") from e
    register = getattr(mod, "register", None)
    if register is None:
        raise typer.BadParameter(f"module {module!r} has no register(registry) function", param_hint="--import")
    try:
        register(registry)
    except Exception as e:
        raise ConfigError(f"--import {module}: its register(registry) raised {_one_line(e)}") from e
    return mod


def _one_line(error: BaseException) -> str:
    return error_text(error).split("\n", 1)[0]


# Every command that prints a result takes this one option (as sqlite-utils' output_options).
JSON_OPTION = typer.Option(False, "--json", help="Print JSON (schema: docs/cli-json.md) instead of text.")


def print_json(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")
    sys.stdout.flush()
