"""Which driver runs an engine's hot path: ``Backend`` (backend.py) for SQLite (sqlite.py) or
PostgreSQL (postgresql.py)."""

from __future__ import annotations

import sqlalchemy as sa

from .backend import Backend


def for_engine(engine: sa.Engine) -> Backend:
    """The driver for ``engine``'s database. Each is imported only when a ledger of its kind is
    opened: the PostgreSQL one loads psycopg, which a SQLite process never needs."""
    if engine.dialect.name == "postgresql":
        from .postgresql import PostgresBackend

        return PostgresBackend(engine)
    from .sqlite import SQLiteBackend

    return SQLiteBackend(engine)
