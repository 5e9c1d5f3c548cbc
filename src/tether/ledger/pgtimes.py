"""PostgreSQL times as tether's connections read them: ``timestamptz`` by psycopg's own loader,
each distinct value of a cursor converted once (``engine.create_engine`` installs it on every
connection it opens)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import adapters, postgres, pq
from psycopg.adapt import Loader

_TIMESTAMPTZ = postgres.types["timestamptz"].oid
_SEEN_MAX = 1024  # distinct times a cursor keeps: a read of many rows holds no more


class _Times(Loader):
    """``timestamptz`` on tether's connections: psycopg's own loader, each distinct value of a
    cursor converted once. A claimed batch shares its claim time (``locked_at``, ``claimed_at``)
    and a bulk enqueue's jobs their created and run times, while a conversion (a datetime made,
    shifted by its offset, moved to the session's time zone) costs a claimed job's worker more
    than any step of its own (benchmarks/README.md)."""

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._convert = adapters.get_loader(_TIMESTAMPTZ, pq.Format.TEXT)(oid, context).load  # type: ignore[misc]
        self._seen: dict[bytes, datetime] = {}

    def load(self, data: Any) -> datetime:
        key = bytes(data)
        when = self._seen.get(key)
        if when is None:
            if len(self._seen) >= _SEEN_MAX:
                self._seen.clear()
            when = self._seen[key] = self._convert(data)
        return when


def read_times_once(dbapi_connection: Any, _record: Any) -> None:
    """The engine's connect hook: this connection reads ``timestamptz`` with ``_Times``."""
    dbapi_connection.adapters.register_loader(_TIMESTAMPTZ, _Times)
