"""``tether status`` on a SQLite ledger file without SQLAlchemy: the stdlib ``sqlite3``, opened
read-only, runs the statements of ``health`` as compiled ahead for SQLite (the catalogue's
``ledger/statements/status.sql``, written by ``compile_lite``), and the rows become the same
``Stats``, ``Activity`` and ``Health`` as ``observe.health`` gives, through the same functions.
Loading SQLAlchemy costs a command more than all of its own work (benchmarks/README.md,
cli_startup).

Only a plain ``sqlite:///path`` is read here; any other URL (PostgreSQL, a driver or query
string, an unusual path) keeps the SQLAlchemy path, whose errors it gives. Errors are those of
``readonly``: NoLedger, a LedgerFault, DatabaseUnavailable, or the driver's own error.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from .. import config
from ..clock import SystemClock
from ..errors import DatabaseUnavailable
from ..ledger import faults
from ..ledger.catalogue import STATEMENTS, parse
from ..ledger.ledgerfile import TABLE, ledger_file, no_table
from ..ledger.sqlitetime import to_text
from .backlog import stats_of
from .verdict import Health, Thresholds, activity_of, assess

_PLAIN = "sqlite:///"
_UNUSUAL = set("?#%@:")  # a query string, escapes, a password-like part: SQLAlchemy parses those
STATUS = parse((STATEMENTS / "status.sql").read_text(encoding="utf-8"))
"""The statements of ``tether status`` by name, compiled for SQLite (``compile_lite``)."""


def sqlite_file(url: str | None, schema: str | None = None) -> str | None:
    """The file a plain ``sqlite:///path`` URL (``url``, else TETHER_DB) names, or None when the
    URL needs SQLAlchemy: another database, a driver, a query string, a schema (an error there)."""
    url = config.db_url(url)
    database = url[len(_PLAIN) :] if url.startswith(_PLAIN) else ""
    if not database or database == ":memory:" or _UNUSUAL & set(database) or config.schema(schema):
        return None
    return database


def connect(database: str) -> sqlite3.Connection:
    """A read-only connection to the ledger file ``database``, after the checks and with the
    errors of ``readonly.open_ledger``: it never creates a file, nor the table."""
    path = str(ledger_file(database))
    try:
        conn = sqlite3.connect(
            f"file:{quote(path)}?mode=ro", uri=True, timeout=config.BUSY_TIMEOUT, isolation_level=None
        )
    except sqlite3.Error as e:
        raise _opening_error(e, path) from e
    try:
        present = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    except sqlite3.Error as e:
        conn.close()
        raise _opening_error(e, path) from e
    if present is None:
        conn.close()
        raise no_table(f"{_PLAIN}{path}")
    return conn


def _opening_error(e: sqlite3.Error, path: str) -> Exception:
    fault = faults.ledger_fault(e, path)
    if fault is not None:
        return fault
    if not isinstance(e, sqlite3.OperationalError):
        return e
    reason = " ".join(str(e).split())
    return DatabaseUnavailable(f"cannot open the database at {_PLAIN}{path}: {reason}")


def _rows(conn: sqlite3.Connection, name: str, times: dict[str, str]) -> list[Any]:
    return conn.execute(STATUS[name], times).fetchall()


def health(
    database: str,
    thresholds: Thresholds | None = None,
    *,
    lock_timeout: float | None = None,
    now: datetime | None = None,
) -> Health:
    """``observe.health.health`` of the SQLite ledger file ``database``, in one read transaction."""
    th = thresholds or Thresholds()
    now = now or SystemClock.now()
    lock_timeout = config.DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout
    times = {
        "now": to_text(now),
        "cutoff": to_text(now - timedelta(seconds=lock_timeout)),
        "since": to_text(now - timedelta(seconds=th.window)),
    }
    conn = connect(database)
    try:
        conn.execute("BEGIN")  # deferred: a reader never takes the write lock
        # In the order of health.stats: the first statement to fail is the one each path names.
        backlog = _rows(conn, "backlog", times)
        failed, stuck, quarantined = (_rows(conn, k, times)[0][0] for k in ("failed", "stuck", "quarantined"))
        deepest = _rows(conn, "deepest", times)
        s = stats_of(now, lock_timeout, backlog, failed, stuck, quarantined, deepest[0] if deepest else None)
        act = activity_of(th.window, _rows(conn, "finished", times), _rows(conn, "run_times", times))
    except sqlite3.OperationalError as e:
        raise DatabaseUnavailable(f"could not read the ledger: {' '.join(str(e).split())}") from e
    finally:
        conn.close()  # ends the transaction: nothing was written
    return assess(s, th, act)
