"""The status CHECK of a ledger created before a status existed, widened in place; on SQLite, one
spelled ``status IN (...)`` by an earlier tether respelled as this one writes it (schema.py says why).

``ensure_schema`` adds missing columns and indexes; a CHECK constraint it cannot add, only
replace. PostgreSQL replaces it with ALTER TABLE, the new one NOT VALID: the stored rows kept the
narrower check, so they keep this one, and validating would scan the whole table under the lock
that stops every worker. SQLite has no statement for it, and rebuilding
the table would copy every row: its own documentation's way for a change that leaves the stored
rows as they are (a CHECK that allows more) is to rewrite the table's definition in
``sqlite_schema`` and bump the schema cookie, so every connection reloads it. Only the one
constraint, whose old text must be a CHECK an earlier tether wrote, is rewritten; anything
else found there is left alone. The respelling allows exactly what the old text did, and the
widening more, so the stored rows satisfy either.
"""

from __future__ import annotations

import sqlalchemy as sa

from .schema import STATUS_CHECK, STATUS_CHECK_SQL, TABLE
from .status import JobStatus

# The constraint as this tether writes it. Spelled here rather than compiled from an
# ``AddConstraint`` of the table's, which would keep every later CREATE TABLE from writing it.
_WANTED = f"CONSTRAINT {STATUS_CHECK} CHECK ({STATUS_CHECK_SQL})"


def _allows_all(definition: str) -> bool:
    return all(f"'{status.value}'" in definition for status in JobStatus)


def widen(conn: sa.Connection, dialect: sa.Dialect) -> bool:
    """Replace the jobs table's status CHECK when it lacks a status this tether knows (on SQLite,
    also when it is spelled otherwise); returns whether it did. Runs in ``ensure_schema``'s
    transaction."""
    if dialect.name == "postgresql":
        return _widen_postgresql(conn)
    return _widen_sqlite(conn)


def _widen_postgresql(conn: sa.Connection) -> bool:
    current = conn.execute(
        sa.text(
            "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint AS c JOIN pg_class AS t ON c.conrelid = t.oid"
            " JOIN pg_namespace AS n ON n.oid = t.relnamespace"
            " WHERE n.nspname = current_schema() AND t.relname = :table AND c.conname = :name"
        ),
        {"table": TABLE, "name": STATUS_CHECK},
    ).scalar()
    if current is not None and _allows_all(current):
        return False
    if current is not None:
        conn.exec_driver_sql(f"ALTER TABLE {TABLE} DROP CONSTRAINT {STATUS_CHECK}")
    conn.exec_driver_sql(f"ALTER TABLE {TABLE} ADD {_WANTED} NOT VALID")
    return True


def _widen_sqlite(conn: sa.Connection) -> bool:
    definition = conn.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
    ).scalar()
    if definition is None or _WANTED in definition:
        return False
    start = definition.find(f"CONSTRAINT {STATUS_CHECK} CHECK (")
    end = _closing(definition, start + len(f"CONSTRAINT {STATUS_CHECK} CHECK "))
    if start < 0 or end < 0 or definition.count(STATUS_CHECK) != 1:
        return False  # not the constraint an earlier tether wrote: left as it is
    widened = definition[:start] + _WANTED + definition[end + 1 :]
    cookie = conn.exec_driver_sql("PRAGMA schema_version").scalar() or 0
    conn.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        conn.exec_driver_sql("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (widened, TABLE))
        conn.exec_driver_sql(f"PRAGMA schema_version = {int(cookie) + 1}")
    finally:
        conn.exec_driver_sql("PRAGMA writable_schema = OFF")
    return True


def _closing(text: str, opening: int) -> int:
    """The index of the parenthesis that closes the one at ``opening`` (status names hold none), or -1."""
    if opening < 0 or text[opening : opening + 1] != "(":
        return -1
    depth = 0
    for i in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return -1
