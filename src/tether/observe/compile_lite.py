"""Writes ``_lite_sql.py``: the statements ``tether status`` runs, compiled for SQLite, so that
``lite`` runs them on a SQLite file without loading SQLAlchemy (see benchmarks/README.md,
cli_startup). The statements themselves stay defined once, in ``queries``; tests/test_lite.py
compiles them again and fails while the module written here differs.

    .venv/bin/python -m tether.observe.compile_lite
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.dialects import sqlite

from ..ledger.schema import TABLE
from .health import finished_statement, run_times_statement, stats_statements

TARGET = Path(__file__).with_name("_lite_sql.py")
COMMAND = "python -m tether.observe.compile_lite"

Param = tuple[str, Any]
"""``("arg", name)``: a time the caller passes by that name; ``("value", v)``: a constant."""


def _statements(at: dict[str, datetime]) -> dict[str, Any]:
    return {
        **stats_statements(at["now"], at["cutoff"]),
        "finished": finished_statement(at["since"], at["now"]),
        "run_times": run_times_statement("sqlite", at["since"]),
    }


def compiled() -> dict[str, tuple[str, tuple[Param, ...]]]:
    """Each statement's SQLite text and its parameters in order. The times are bound to stand-in
    values here and named back by them, so a statement's builder stays its only definition."""
    base = datetime(2000, 1, 1, tzinfo=UTC)
    at = {name: base + timedelta(days=i) for i, name in enumerate(("now", "cutoff", "since"))}
    named = {value: name for name, value in at.items()}
    out = {}
    for key, statement in _statements(at).items():
        c = statement.compile(dialect=sqlite.dialect(), compile_kwargs={"render_postcompile": True})
        params: list[Param] = []
        for bind in c.positiontup or ():
            value = c.params[bind]
            if isinstance(value, datetime):
                params.append(("arg", named[value]))  # a time no caller named is a KeyError here
            else:
                params.append(("value", value))
        out[key] = (str(c), tuple(params))
    return out


def render() -> str:
    """The text of ``_lite_sql.py``."""
    lines = [
        f'"""Written by ``{COMMAND}`` from the statements in ``queries``: do not edit.',
        "",
        "``tether status`` on a SQLite file runs these through ``lite`` without loading SQLAlchemy.",
        '"""',
        "",
        "from typing import Any",
        "",
        f"TABLE = {TABLE!r}",
        "",
        "STATEMENTS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {",
    ]
    for key, (text, params) in compiled().items():
        lines.append(f"    {key!r}: (")
        lines += [f"        {line!r}" for line in _lines(text)]
        lines.append(f"        , {params!r},")
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _lines(text: str) -> list[str]:
    """The statement's text in pieces that join back into it (one per line of SQL)."""
    return text.splitlines(keepends=True) or [""]


def main() -> None:
    TARGET.write_text(render())
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
