"""A SQLite ledger's file as tether must find it: a regular file that is not empty. Checked
before any connection opens it, since SQLite would take a missing or empty file for a new
database, and opening a FIFO would block; ``engine``, ``observe.readonly`` and ``observe.lite``
(no SQLAlchemy) share these checks and messages, and the message for a database without the
jobs table (``no_table``).
"""

from __future__ import annotations

import stat
from pathlib import Path

from ..errors import NoLedger

TABLE = "tether_jobs"  # ledger.schema.TABLE, which loads SQLAlchemy; tests/test_lite.py keeps them one

CREATE_HINT = ", or create a ledger there with `tether init`"


def no_table(where: str, schema: str | None = None) -> NoLedger:
    """The error for a database at ``where`` (a URL, its password masked) that holds no tether
    ledger; on PostgreSQL it names the ``schema`` searched, so a mistyped --schema reads as one."""
    place, check = (f"its schema {schema!r}", "--db and --schema") if schema else ("the database", "--db")
    return NoLedger(f"no ledger at {where} ({place} has no {TABLE} table; check {check}{CREATE_HINT})")


def not_a_file(path: Path, mode: int) -> NoLedger:
    """The error for a ledger path that exists as something other than a regular file (``mode``:
    its ``st_mode``): a directory, a FIFO, a device, a socket. Found by ``stat``, never by
    opening it."""
    what = "it is a directory, not a ledger file" if stat.S_ISDIR(mode) else "it is not a regular file"
    return NoLedger(f"no ledger at {path} ({what}; check --db or TETHER_DB)")


def missing_file(path: Path) -> NoLedger:
    """The error for a ledger file that does not exist (nothing was created in its place)."""
    return NoLedger(f"no ledger at {path} (the file does not exist; check --db or TETHER_DB{CREATE_HINT})")


def ledger_file(database: str) -> Path:
    """The absolute path of the ledger file ``database`` names; NoLedger, saying why, when there
    is none to read."""
    path = Path(database).expanduser().absolute()
    try:
        st = path.stat()
    except OSError:
        raise missing_file(path) from None
    if not stat.S_ISREG(st.st_mode):
        raise not_a_file(path, st.st_mode)
    if st.st_size == 0:
        raise NoLedger(f"no ledger at {path} (the file is empty, 0 bytes, so it has no {TABLE} table)")
    return path
