"""Which driver runs an engine's hot path: ``Backend`` (backend.py) for SQLite (sqlite.py) or
PostgreSQL (postgresql.py)."""

from __future__ import annotations

import sqlalchemy as sa

from .backend import Backend
from .postgresql import PostgresBackend
from .sqlite import SQLiteBackend


def for_engine(engine: sa.Engine) -> Backend:
    """The driver for ``engine``'s database."""
    return PostgresBackend(engine) if engine.dialect.name == "postgresql" else SQLiteBackend(engine)
