"""What opening a coordinator settles besides the ledger: the clock its times come from, the
data root its jobs write into, the channel that wakes its workers."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from .clock import Clock, DatabaseClock, SystemClock
from .errors import ConfigError
from .jobtypes.datafiles.durable import make_root
from .ledger.catalogue import POSTGRESQL
from .ledger.engine import opening_error, schema_of


def ledger_clock(engine: sa.Engine, clock: Clock | None) -> Clock:
    """The clock a ledger's times come from. On PostgreSQL workers on several machines share the
    ledger and each machine's clock may be off, so the machine's clock (``SystemClock``, given or
    not) gives way to the database's, which they all read alike (``DatabaseClock``); any other
    clock (a test's ``FakeClock``) is used as given. On SQLite every process reads one machine's
    clock. A database clock is read once here; sweeps and heartbeats read it again."""
    if engine.dialect.name == "postgresql" and (clock is None or isinstance(clock, SystemClock)):
        clock = DatabaseClock(machine=clock)
    if isinstance(clock, DatabaseClock) and not clock.synced:
        try:
            with engine.connect() as conn:
                clock.sync(conn.exec_driver_sql(POSTGRESQL.DATABASE_TIME).scalar_one)
        except sa.exc.SQLAlchemyError as e:
            raise opening_error(engine, e) from e
    return clock or SystemClock()


def prepare_root(root: Path, *, create: bool) -> None:
    """A data root must be a directory; only the open that records it first (a new ledger) makes
    one (durably), so a mistyped path is an error rather than a new, empty root jobs write into."""
    if root.is_dir():
        return
    if root.exists():
        raise ConfigError(f"data root {root} is not a directory")
    if not create:
        raise ConfigError(
            f"data root {root} does not exist; create it, or pass the right --root (a ledger creates "
            "its root only when the ledger itself is new)"
        )
    try:
        make_root(root)
    except OSError as e:
        raise ConfigError(f"cannot create the data root {root}: {e.strerror}") from e


def channel_of(engine: sa.Engine) -> str:
    """The wake-up channel of a ledger: one per PostgreSQL schema, so ledgers in one database
    do not wake each other's workers."""
    schema = schema_of(engine)
    return f"tether_jobs_{schema}" if schema else "tether_jobs"
