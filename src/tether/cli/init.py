"""``tether init``: create a ledger, the one command that does. Every other command needs the
ledger to exist, so a mistyped --db is an error rather than a new, empty ledger nobody serves."""

from __future__ import annotations

import typer

from ..errors import NoLedger, TetherError
from .app import JSON_OPTION, Settings, app, open_coordinator, out, print_json


@app.command()
def init(ctx: typer.Context, as_json: bool = JSON_OPTION) -> None:
    """Create the ledger named by --db (and its data root, --root, default the working directory);
    print what was created. A ledger that exists already is left as it is (exit 0), except that
    one from an older tether is upgraded in place (said so).

    Example: tether --db sqlite:///ledger/tether.db --root ./data init
    """
    from ..ledger.engine import ledger_url
    from ..ledger.meta import SCHEMA_VERSION

    older = _older_version(ctx.obj)
    try:
        coordinator = open_coordinator(ctx.obj)
        created = False
    except NoLedger:
        coordinator = open_coordinator(ctx.obj, create=True)
        created = True
    with coordinator:
        ledger, root = ledger_url(coordinator.engine), str(coordinator.root)
    if as_json:
        print_json({"created": created, "ledger": ledger, "root": root, "upgraded_from": older})
    elif created:
        out.print(f"created the ledger {ledger}\n  data root {root}", markup=False, soft_wrap=True)
    elif older is not None:
        said = f"the ledger {ledger} exists already: upgraded from schema {older} to {SCHEMA_VERSION}"
        out.print(f"{said}\n  data root {root}", markup=False)
    else:
        out.print(f"the ledger {ledger} exists already (nothing created)\n  data root {root}", markup=False)


def _older_version(settings: Settings) -> int | None:
    """The existing ledger's schema version when this open will upgrade it; else None."""
    from ..ledger.meta import older_version
    from .output import ledger

    try:
        with ledger(settings) as engine:
            return older_version(engine)
    except TetherError:  # none there yet, or unreadable: the open says which
        return None
