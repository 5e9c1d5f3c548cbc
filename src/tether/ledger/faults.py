"""Ledger faults: the database errors that retrying cannot mend.

A locked SQLite file or a dropped PostgreSQL connection passes; a worker backs off and tries
again. A corrupt ledger, a full disk, a read-only file or mount, a disk that fails to read or
write, a ledger file deleted or emptied under a running worker do not: retrying them for ever
hides the fault while nothing gets done. Those become ``LedgerFault``, which stops a worker (the
CLI exits ``EXIT_LEDGER_FAULT``) after it has given back what it holds where the ledger still
lets it. Faults are told by the driver's error code (SQLite's result code, PostgreSQL's
SQLSTATE), never by matching message text.
"""

from __future__ import annotations

import os

from ..errors import LedgerFault

EXIT_LEDGER_FAULT = 74
"""Exit status of a command stopped by a ledger fault (``EX_IOERR`` of sysexits.h). Distinct from
1 (bad input, unreachable database) so a supervisor can stop restarting: systemd's
``RestartPreventExitStatus=74``."""

CORRUPT, FULL, READ_ONLY, IO_ERROR, UNOPENABLE, GONE = "corrupt", "full", "read-only", "I/O error", "unopenable", "gone"

_SQLITE = {  # primary result codes (the low byte of the extended code)
    11: CORRUPT,  # SQLITE_CORRUPT: database disk image is malformed
    26: CORRUPT,  # SQLITE_NOTADB: file is not a database
    13: FULL,  # SQLITE_FULL: database or disk is full
    8: READ_ONLY,  # SQLITE_READONLY: attempt to write a readonly database
    10: IO_ERROR,  # SQLITE_IOERR: disk I/O error
    14: UNOPENABLE,  # SQLITE_CANTOPEN: unable to open database file
}
_POSTGRES = {
    "XX001": CORRUPT,  # data_corrupted
    "XX002": CORRUPT,  # index_corrupted
    "53100": FULL,  # disk_full
    "25006": READ_ONLY,  # read_only_sql_transaction (a standby, default_transaction_read_only)
    "42501": READ_ONLY,  # insufficient_privilege: this role may not write the ledger
    "42P01": GONE,  # undefined_table: the ledger table was dropped
    "3F000": GONE,  # invalid_schema_name: its schema was dropped
    "3D000": GONE,  # invalid_catalog_name: the database was dropped
}
_ADVICE = {
    CORRUPT: "stop every worker and restore the ledger from a backup (SQLite: sqlite3 FILE .recover)",
    FULL: "free space on the disk that holds it, then start the worker again",
    READ_ONLY: "make it writable (file permissions, mount, database role), then start the worker again",
    IO_ERROR: "check the disk that holds it, then start the worker again",
    UNOPENABLE: "check that it exists and that this user may write it and its directory (SQLite in WAL mode "
    "writes FILE-wal and FILE-shm beside it), then start the worker again",
    GONE: "find out what removed it; restore it from a backup rather than starting an empty one",
}


def driver_error(error: BaseException) -> BaseException:
    """The driver's own exception inside a SQLAlchemy one (or ``error`` itself)."""
    orig = getattr(error, "orig", None)
    return orig if isinstance(orig, BaseException) else error


def describe(error: BaseException) -> str:
    """``ExceptionType: message`` on one line, from the driver's exception: a SQLAlchemy error's
    own text adds the statement and its parameters (payload contents), never wanted in a log."""
    orig = driver_error(error)
    message = " ".join(str(orig).split())
    return f"{type(orig).__name__}: {message}" if message else type(orig).__name__


def kind_of(error: BaseException) -> str | None:
    """The kind of ledger fault ``error`` is (CORRUPT, FULL, ...), or None when it may pass."""
    if isinstance(error, LedgerFault):
        return error.kind
    orig = driver_error(error)
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int):
        return _SQLITE.get(code & 0xFF)
    sqlstate = getattr(orig, "sqlstate", None)
    if isinstance(sqlstate, str):
        return _POSTGRES.get(sqlstate)
    return None


def ledger_fault(error: BaseException, where: str) -> LedgerFault | None:
    """``error`` as a LedgerFault naming the ledger ``where`` (a masked URL or a path), or None
    when it is worth retrying."""
    if isinstance(error, LedgerFault):
        return error
    kind = kind_of(error)
    if kind is None:
        return None
    if kind in (IO_ERROR, UNOPENABLE, READ_ONLY):
        kind = _filesystem_state(where) or kind
    return fault(kind, where, describe(error))


def _filesystem_state(path: str) -> str | None:
    """READ_ONLY or FULL if the filesystem holding a SQLite ledger at ``path`` is; SQLite reports
    both as "disk I/O error" or "unable to open database file" when the -shm file is at fault."""
    if not os.path.isabs(path):
        return None  # a masked URL: PostgreSQL says what it means
    try:
        st = os.statvfs(os.path.dirname(path))
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return READ_ONLY
    return FULL if st.f_bavail == 0 else None


def fault(kind: str, where: str, reason: str) -> LedgerFault:
    """The LedgerFault of ``kind`` for the ledger at ``where``, its ``reason`` and what to do."""
    what = "the disk holding the ledger" if kind == FULL else "the ledger"
    state = {
        CORRUPT: "is corrupt",
        FULL: "is full",
        READ_ONLY: "is read-only",
        IO_ERROR: "cannot be read or written",
        UNOPENABLE: "cannot be opened",
    }
    return LedgerFault(kind, f"{what} at {where} {state.get(kind, 'is gone')} ({reason}); {_ADVICE[kind]}")
