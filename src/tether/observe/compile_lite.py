"""Writes ``ledger/statements/status.sql``: the statements ``tether status`` runs, compiled for
SQLite, so that ``lite`` runs them on a SQLite file without loading SQLAlchemy (see
benchmarks/README.md, cli_startup). The statements themselves stay defined once, in ``health``;
tests/test_lite.py compiles them again and fails while the file written here differs.

    .venv/bin/python -m tether.observe.compile_lite
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BindParameter

from ..ledger.catalogue import STATEMENTS
from .health import finished_statement, run_times_statement, stats_statements

TARGET = STATEMENTS / "status.sql"
COMMAND = "python -m tether.observe.compile_lite"
TIMES = ("now", "cutoff", "since")
"""The times a caller binds, by name (``:now``...); every other value is written into the text."""


def _statements(at: dict[str, datetime]) -> dict[str, Any]:
    return {
        **stats_statements(at["now"], at["cutoff"]),
        "finished": finished_statement(at["since"], at["now"]),
        "run_times": run_times_statement("sqlite", at["since"]),
    }


def compiled() -> dict[str, str]:
    """Each statement's SQLite text. The times are built with stand-in values and each becomes the
    named parameter of its name (so a statement's builder stays its only definition); the other
    values are constants of the statement, written as SQLite literals."""
    base = datetime(2000, 1, 1, tzinfo=UTC)
    at = {name: base + timedelta(days=i) for i, name in enumerate(TIMES)}
    named = {value: name for name, value in at.items()}

    def as_parameter(element: Any, **_: Any) -> Any:
        if isinstance(element, BindParameter) and isinstance(element.value, datetime):
            return sa.literal_column(":" + named[element.value])  # a time no caller names: KeyError
        return None

    out = {}
    for key, statement in _statements(at).items():
        timed = visitors.replacement_traverse(statement, {}, as_parameter)
        out[key] = str(timed.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
    return out


def render() -> str:
    """The text of ``status.sql``."""
    lines = [
        f"-- Written by ``{COMMAND}`` from the statements in observe/health.py, compiled",
        "-- for SQLite: do not edit. ``tether status`` on a SQLite file runs these through observe/lite.py",
        "-- without loading SQLAlchemy; " + ", ".join(f":{t}" for t in TIMES) + " are the times it binds.",
    ]
    for key, text in compiled().items():
        lines += ["", f"-- name: {key}", *(line.rstrip() for line in text.splitlines())]
    return "\n".join(lines) + "\n"


def main() -> None:
    TARGET.write_text(render())
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
