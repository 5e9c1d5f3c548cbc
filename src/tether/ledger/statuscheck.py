"""The status CHECK of a ledger created before a status existed, widened in place.

``ensure_schema`` adds missing columns and indexes; a CHECK constraint it cannot add, only
replace. PostgreSQL replaces it with ALTER TABLE, the new one NOT VALID: the stored rows kept the
narrower check, so they keep this one, and validating would scan the whole table under the lock
that stops every worker. SQLite has no statement for it, and rebuilding
the table would copy every row: its own documentation's way for a change that leaves the stored
rows as they are (a CHECK that allows more) is to rewrite the table's definition in
``sqlite_schema`` and bump the schema cookie, so every connection reloads it. Only the one
constraint, whose old text must be exactly what an earlier tether wrote, is rewritten; anything
else found there is left alone.
"""

from __future__ import annotations

import sqlalchemy as sa

from .schema import STATUS_CHECK, TABLE, jobs
from .status import JobStatus


def _wanted(dialect: sa.Dialect) -> str:
    """The constraint as this tether writes it: ``CONSTRAINT name CHECK (...)``."""
    [check] = [c for c in jobs.constraints if c.name == STATUS_CHECK]
    return str(sa.schema.AddConstraint(check).compile(dialect=dialect)).split(" ADD ", 1)[1].strip()


def _allows_all(definition: str) -> bool:
    return all(f"'{status.value}'" in definition for status in JobStatus)


def widen(conn: sa.Connection, dialect: sa.Dialect) -> bool:
    """Replace the jobs table's status CHECK when it lacks a status this tether knows; returns
    whether it did. Runs in ``ensure_schema``'s transaction."""
    if dialect.name == "postgresql":
        return _widen_postgresql(conn, dialect)
    return _widen_sqlite(conn, dialect)


def _widen_postgresql(conn: sa.Connection, dialect: sa.Dialect) -> bool:
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
    conn.exec_driver_sql(f"ALTER TABLE {TABLE} ADD {_wanted(dialect)} NOT VALID")
    return True


def _widen_sqlite(conn: sa.Connection, dialect: sa.Dialect) -> bool:
    definition = conn.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
    ).scalar()
    if definition is None or _allows_all(definition):
        return False
    start = definition.find(f"CONSTRAINT {STATUS_CHECK} CHECK (")
    end = definition.find("))", start)
    if start < 0 or end < 0 or definition.count(STATUS_CHECK) != 1:
        return False  # not the constraint an earlier tether wrote: left as it is
    widened = definition[:start] + _wanted(dialect) + definition[end + 2 :]
    cookie = conn.exec_driver_sql("PRAGMA schema_version").scalar() or 0
    conn.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        conn.exec_driver_sql("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (widened, TABLE))
        conn.exec_driver_sql(f"PRAGMA schema_version = {int(cookie) + 1}")
    finally:
        conn.exec_driver_sql("PRAGMA writable_schema = OFF")
    return True
