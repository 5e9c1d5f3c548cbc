"""Read-only access to an existing ledger: open it without creating it, read in one transaction.

Used by ``observe`` (the operator's questions) and ``retention``; ``source`` is a
``Coordinator`` or a bare ``Engine``, and ``view_of`` is the one place that tells them apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Union

import sqlalchemy as sa

from .. import config
from ..clock import Clock, SystemClock
from ..errors import DatabaseUnavailable
from ..errors import NoLedger as NoLedger  # `X as X`: defined in errors, this module's API too
from ..ledger import meta
from ..ledger.catalogue import POSTGRESQL
from ..ledger.engine import READ_ONLY, create_engine, require_ledger
from ..ledger.ledgerfile import ledger_file
from ..ledger.record import JobRecord
from ..ledger.schema import FINISHED_SQL, RECORD_COLUMNS
from ..ledger.schema import jobs as jobs_table
from ..ledger.url import parse_url

if TYPE_CHECKING:
    from ..coordinator import Coordinator

Source = Union["Coordinator", sa.Engine]
"""What a reader reads: an application's ``Coordinator``, or a bare ``Engine`` (the CLI's)."""

COLUMNS = [jobs_table.c[name] for name in RECORD_COLUMNS]


@dataclass(frozen=True)
class SourceView:
    """What a reader needs of its ``Source``: the engine, the clock that says now (a bare engine
    has none: the ledger's own time is read), and the lock age past which a claimed job is stuck."""

    engine: sa.Engine
    clock: Clock | None
    lock_timeout: float


def view_of(source: Source) -> SourceView:
    """``source`` as a reader sees it: a coordinator's own engine, clock and lock timeout; for a
    bare engine, no clock and the default lock timeout."""
    if isinstance(source, sa.Engine):
        return SourceView(source, None, config.DEFAULT_LOCK_TIMEOUT)
    return SourceView(source.engine, source.clock, source.lock_timeout)


# -- opening -------------------------------------------------------------------------------------


def open_ledger(db_url: str | None = None, *, schema: str | None = None) -> sa.Engine:
    """An engine on an existing ledger, for reading: unlike ``Coordinator.open`` it never creates
    a database file or the table, so a mistyped path is an error instead of a new empty ledger."""
    db_url = config.db_url(db_url)
    url = parse_url(db_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        ledger_file(url.database)  # a reader refuses an empty file as no ledger, not as a fault
    engine = create_engine(db_url, schema=config.schema(schema), busy_timeout=config.BUSY_TIMEOUT, create=False)
    try:
        require_ledger(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def engine_of(source: Source) -> sa.Engine:
    return view_of(source).engine


def now_of(source: Source, now: datetime | None) -> datetime:
    """``now``, or the ledger's time: a coordinator's clock; for a bare engine, as the ledger's
    workers read it (``ledger_now``), so a lock's age is the one their sweeps see."""
    if now is not None:
        return now
    view = view_of(source)
    if view.clock is not None:
        return view.clock.now()
    if view.engine.dialect.name != "postgresql":
        return SystemClock().now()
    with reading(source) as conn:
        return ledger_now(conn)


def ledger_now(conn: sa.Connection) -> datetime:
    """Now by the clock a ledger's workers measure by (clock.py): on PostgreSQL the database's,
    since this machine's may be off; on SQLite this machine's, which they all share."""
    if conn.dialect.name == "postgresql":
        at: datetime = conn.execute(sa.text(POSTGRESQL.DATABASE_TIME)).scalar_one()
        return at.astimezone(UTC)
    return SystemClock().now()


def lock_timeout_of(source: Source, lock_timeout: float | None) -> float:
    if lock_timeout is not None:
        return lock_timeout
    return view_of(source).lock_timeout


@contextmanager
def reading(source: Source) -> Iterator[sa.Connection]:
    """One read-only transaction (deferred on SQLite: it never takes the write lock)."""
    try:
        with engine_of(source).connect().execution_options(**READ_ONLY) as conn, conn.begin():
            yield conn
    except (sa.exc.OperationalError, sa.exc.ProgrammingError) as e:
        # A column or table this tether reads may be missing: a ledger not yet upgraded says so.
        version = meta.older_version(engine_of(source))
        if version is not None:
            raise meta.OlderLedger(version) from e
        if isinstance(e, sa.exc.ProgrammingError):
            raise
        raise DatabaseUnavailable(f"could not read the ledger: {' '.join(str(e.orig).split())}") from e


def records(conn: sa.Connection, query: sa.Select[Any]) -> list[JobRecord]:
    return [JobRecord.from_row(r) for r in conn.execute(query)]


def select_jobs() -> sa.Select[Any]:
    return sa.select(*COLUMNS)


def seconds_between(dialect: str, start: Any, end: Any) -> Any:
    """``end - start`` in seconds, computed in SQL so a million rows are not parsed into datetimes
    in Python: SQLite keeps times as text, PostgreSQL as timestamptz."""
    if dialect == "sqlite":
        return (sa.func.julianday(end) - sa.func.julianday(start)) * 86400.0
    # EXTRACT gives numeric (Decimal in Python) since PostgreSQL 14; a float is what callers want.
    return sa.cast(sa.extract("epoch", end - start), sa.Float)


def done() -> sa.TextClause:
    """Matches finished jobs only, in the very condition ``ix_tether_jobs_done`` is partial to
    (SQLite uses a partial index only when the query implies its condition term by term)."""
    return sa.text(FINISHED_SQL)
