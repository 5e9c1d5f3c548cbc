"""A SQLite ledger's file as a reader must find it: a regular file that is not empty. Checked
before any connection opens it, since SQLite would take a missing or empty file for a new
database; ``observe.readonly`` and ``observe.lite`` (no SQLAlchemy) share these checks and messages.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import NoLedger

TABLE = "tether_jobs"  # ledger.schema.TABLE, which loads SQLAlchemy; tests/test_lite.py keeps them one


def ledger_file(database: str) -> Path:
    """The absolute path of the ledger file ``database`` names; NoLedger, saying why, when there
    is none to read."""
    path = Path(database).expanduser().absolute()
    if not path.is_file():
        if path.is_dir():
            what = "it is a directory, not a ledger file"
        else:
            what = "it is not a regular file" if path.exists() else "the file does not exist"
        raise NoLedger(f"no ledger at {path} ({what}; check --db or TETHER_DB)")
    if path.stat().st_size == 0:
        raise NoLedger(f"no ledger at {path} (the file is empty, 0 bytes, so it has no {TABLE} table)")
    return path
