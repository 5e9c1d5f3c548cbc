"""Running the hot statements on the driver connection itself.

SQLAlchemy's statement execution costs many times a bare driver call, more than the fsync of a
commit (benchmarks/README.md, "Figures behind the code"). The hot path (enqueue, claim, transitions,
heartbeats, sweep) therefore runs the named SQL of ``sql.py`` on the DBAPI connection: on
PostgreSQL a pooled one, on SQLite one write connection per thread kept out of the pool.
SQLAlchemy still owns the pool, the connect-time set-up and every read that is not hot.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa

from .. import events
from ..errors import LedgerFault
from . import conflict, faults
from .record import JobRecord, make_tuple
from .schema import TABLE
from .sql import INSERT_UNKEYED, INSERT_UNKEYED_ROW, unpinned
from .status import JobStatus

_T = TypeVar("_T")
_NAMED = re.compile(r"(?<![:\w]):(\w+)")
_TABLE = re.compile(rf"\b{TABLE}\b")
_UTC = UTC
_TIME_COLUMNS = (9, 10, 11, 12, 13)  # locked_at, created_at, claimed_at, completed_at, run_at
_STATUS = {s.value: s for s in JobStatus}


class Backend:
    """The driver-level access to one database; ``for_engine`` picks SQLite or PostgreSQL."""

    name = "base"
    one_machine = False
    """Whether every process on this ledger runs on one machine, sharing its clocks (SQLite: a
    ledger on local storage). Then a pause that stops one worker's clocks (a suspend, a paused
    VM) stops every worker, and no other can have taken its jobs meanwhile."""
    reads_json = True  # can read many rows from one JSON value (sql.INSERT_PAYLOADS_*, COMPLETE_MANY_*...)

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._dbapi_error = engine.dialect.loaded_dbapi.Error
        self.lock_waits = 0
        """Write transactions that found the ledger's write lock held and waited for it (SQLite:
        a whole-file lock; a worker claims larger batches while it is contended)."""

    @staticmethod
    def for_engine(engine: sa.Engine) -> Backend:
        return PostgresBackend(engine) if engine.dialect.name == "postgresql" else SQLiteBackend(engine)

    # -- statements and values -----------------------------------------------------------------

    def sql(self, statement: str) -> str:
        return statement

    def bind(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return dict(params)

    def time(self, value: datetime) -> Any:
        """A time as this driver stores it."""
        return value

    def insert_values(self, job: JobRecord) -> dict[str, Any]:
        """The named values of ``sql.INSERT`` for a new ``job``, already bound."""
        return {
            "id": job.id,
            "type": job.type,
            "payload": job.payload,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "created_at": self.time(job.created_at),
            "run_at": self.time(job.run_at),  # most often created_at: the time cache's hit
            "idempotency_key": job.idempotency_key,
            "ordering_key": job.ordering_key,
            "parent_id": job.parent_id,
            "timeout": job.timeout,
            "payload_bytes": job.payload_bytes,
        }

    def insert_alone(self, job: JobRecord) -> None:
        """Insert ``job`` (no idempotency key, no target) as its own durable transaction."""
        self.execute_alone(INSERT_UNKEYED, self.insert_values(job))

    def record(self, row: tuple[Any, ...]) -> JobRecord:
        return JobRecord(*row[:3], _STATUS[row[3]], *row[4:])  # type: ignore[call-arg]  # mypy cannot count a *row[4:]

    def records(self, rows: list[tuple[Any, ...]]) -> list[JobRecord]:
        record = self.record
        return [record(row) for row in rows]

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def write(self, conn: Any = None) -> Iterator[_Cursor]:
        """A cursor inside one write transaction, committed when the block ends. With ``conn``
        (an application's SQLAlchemy connection), the caller's transaction is used instead.
        A lost connection raises LostConnection, or LostCommit when it was lost during COMMIT."""
        if conn is not None:
            cur = conn.connection.driver_connection.cursor()
            try:
                yield _Cursor(self, cur)
            except self._dbapi_error as e:
                raise self._wrap(e) from e
            finally:
                cur.close()
            return
        try:
            raw, driver = self._checkout_writer()
        except self._dbapi_error as e:
            raise self._wrap(e) from e
        committing = False
        try:
            cur = driver.cursor()
            try:
                self._begin(cur)
                yield _Cursor(self, cur)
                committing = True
                self._commit(driver, cur)
            except BaseException:
                self._rollback(driver, cur)
                raise
            finally:
                cur.close()
        except self._dbapi_error as e:
            raise self._wrap(e, driver, committing=committing) from e
        finally:
            if raw is not None:
                self._give_back(raw, driver)

    # -- retry of a conflict (conflict.py): around write(), not inside it -------------------------

    def transact(self, body: Callable[[_Cursor], _T]) -> _T:
        """``body(cur)`` in one write transaction of tether's own (``write()``), run again whole,
        in a new transaction, when the database ends it to break a conflict with another one
        (a deadlock). ``body`` builds what it returns afresh on each run, so nothing of a run
        the database ended is kept."""
        attempt = 1
        while True:
            try:
                with self.write() as cur:
                    return body(cur)
            except sa.exc.DBAPIError as e:
                if not conflict.run_again(e, attempt):
                    raise
                attempt += 1

    def execute_alone(self, statement: str, values: Mapping[str, Any]) -> int:
        """One statement as its own durable transaction, ``values`` already bound; returns the
        rows it changed."""
        return self.transact(lambda cur: cur.execute(statement, values))

    def _checkout_writer(self) -> tuple[Any, Any]:
        """(pooled connection to return or None, driver connection) for one write transaction."""
        raw = self.engine.raw_connection()
        return raw, raw.driver_connection

    def close(self) -> None:
        """Close connections this backend holds outside the engine's pool."""

    def file_fault(self) -> LedgerFault | None:
        """A LedgerFault if the ledger's file is no longer the one this backend opened (a cheap
        check; PostgreSQL has no file of ours to watch)."""
        return None

    @contextmanager
    def read(self) -> Iterator[_Cursor]:
        """A cursor for a single consistent read (no write lock taken)."""
        raw = self.engine.raw_connection()
        driver = raw.driver_connection
        assert driver is not None  # None only once the connection is closed
        try:
            cur = driver.cursor()
            try:
                yield _Cursor(self, cur)
            finally:
                cur.close()
                self._end_read(driver)
        except self._dbapi_error as e:
            raise self._wrap(e, driver) from e
        finally:
            self._give_back(raw, driver)

    def ask(self, statement: str, params: Mapping[str, Any]) -> Any:
        """The first column of the first row of one read statement (None: no row)."""
        with self.read() as cur:
            return cur.scalar(statement, params)

    def _begin(self, cur: Any) -> None:
        pass

    def _commit(self, driver: Any, cur: Any) -> None:
        driver.commit()

    def _rollback(self, driver: Any, cur: Any) -> None:
        try:
            driver.rollback()
        except self._dbapi_error:
            pass

    def _end_read(self, driver: Any) -> None:
        pass

    def _usable(self, driver: Any) -> bool:
        """Whether a driver connection can still run statements (not killed, not cut off)."""
        return True

    def _give_back(self, raw: Any, driver: Any) -> None:
        """Return a pooled connection; a dead one is discarded instead. Returned, it would be
        reset with a ROLLBACK that fails, which SQLAlchemy's pool logs with a traceback."""
        if self._usable(driver):
            raw.close()
        else:
            raw.invalidate()

    def _wrap(self, error: Exception, driver: Any = None, *, committing: bool = False) -> sa.exc.StatementError:
        """Driver errors as SQLAlchemy's (IntegrityError, OperationalError...), as everywhere else;
        one that cost the connection ``driver`` as LostConnection (LostCommit during COMMIT),
        announced by one ``connection_lost`` event."""
        if driver is None or self._usable(driver):
            return sa.exc.DBAPIError.instance(None, None, error, self.engine.dialect.loaded_dbapi.Error)
        events.emit("connection_lost", error=faults.describe(error), during="commit" if committing else None)
        lost = LostCommit if committing else LostConnection
        return lost(None, None, error, connection_invalidated=True)


class LostConnection(sa.exc.OperationalError):
    """A driver error that cost its connection (the server ended it, restarted, or the network
    dropped): the pool has discarded the connection, and the next checkout opens a new one."""


class LostCommit(LostConnection):
    """The connection was lost while its COMMIT was under way, so whether the transaction
    committed is unknown: the server may have made it durable before the answer was lost. A
    caller reads the ledger to find out, or says so (``errors.CommitUnknown``); retrying it as
    if nothing happened can do its work twice. Only a server's commit can be lost this way: a
    SQLite commit either returns or raises with the transaction rolled back."""


class _Writer:
    """One thread's write connection (a holder, since sqlite3 connections take no weak refs)."""

    __slots__ = ("driver", "pool", "pid", "__weakref__")
    driver: sqlite3.Connection
    pool: Any
    pid: int

    def __init__(self, driver: sqlite3.Connection, pool: Any) -> None:
        self.driver = driver
        self.pool = pool
        self.pid = _pid


# Connections a forked child inherited: never used, and never closed by the child either (nor
# by the interpreter freeing the other threads' locals in it): held from just before the fork.
_inherited: list[_Writer] = []
_forking: list[_Writer] = []
_backends: weakref.WeakSet[SQLiteBackend] = weakref.WeakSet()


def _before_fork() -> None:
    _forking.extend(w for b in list(_backends) for w in list(b._writers))


def _after_fork_in_parent() -> None:
    _forking.clear()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()
    _inherited.extend(_forking)
    _forking.clear()


_pid = os.getpid()  # this process's, kept by the fork hook: os.getpid() is a system call


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


def _sqlite_reads_json() -> bool:
    """Whether the linked SQLite has its JSON functions (built in since 3.38, optional before)."""
    conn = sqlite3.connect(":memory:")
    try:
        return bool(conn.execute("SELECT count(*) FROM json_each('[1]')").fetchone()[0] == 1)
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def _sqlite_time(value: datetime) -> str:
    global _last_time, _last_second
    last = _last_time  # one read: another thread may replace it meanwhile
    if last[0] is value:  # a group commit binds one time for many rows
        return last[1]
    if value.tzinfo is _UTC:  # the clock's own: no conversion
        second = _last_second
        if second[0] <= value < second[1]:  # most enqueues: only the microseconds are new
            text = second[2] + "%06d" % value.microsecond  # noqa: UP031 (faster than an f-string here)
        else:
            text = "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031 (% is twice as fast as isoformat)
                value.year,
                value.month,
                value.day,
                value.hour,
                value.minute,
                value.second,
                value.microsecond,
            )
            start = value.replace(microsecond=0)
            _last_second = (start, start + _ONE_SECOND, text[:20])
    elif value.tzinfo is None:
        raise ValueError("tether stores timezone-aware UTC times only")
    else:
        text = value.astimezone(_UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
    _last_time = (value, text)
    return text


_last_time: tuple[datetime | None, str] = (None, "")
# The UTC second last formatted, [start, end), and its text up to the microseconds
# ("YYYY-MM-DD HH:MM:SS."): formatting seven numbers is most of a time's cost.
_last_second: tuple[datetime, datetime, str] = (
    datetime.max.replace(tzinfo=_UTC),
    datetime.min.replace(tzinfo=_UTC),
    "",
)
_ONE_SECOND = timedelta(seconds=1)


def _busy(error: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY and its extended codes: another connection holds the write lock."""
    return getattr(error, "sqlite_errorcode", 5) & 0xFF == 5


class SQLiteBackend(Backend):
    name = "sqlite"
    one_machine = True
    reads_json = _sqlite_reads_json()

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        self._local = threading.local()
        self._writers: weakref.WeakSet[_Writer] = weakref.WeakSet()
        self._busy_timeout = 30.0  # the engine's, read from the first write connection
        _backends.add(self)
        self._path = engine.url.database or ""
        try:
            st = os.stat(self._path)
            self._identity: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            self._identity = None

    def file_fault(self) -> LedgerFault | None:
        # A worker whose ledger file was deleted or swapped would go on writing to the file it
        # has open, which nobody will ever read again; one emptied is a ledger lost.
        if self._identity is None:
            return None
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return faults.fault(faults.GONE, self._path, "the file was deleted while this process had it open")
        except OSError:
            return None  # cannot tell; the next statement will say
        if (st.st_dev, st.st_ino) != self._identity:
            return faults.fault(
                faults.GONE, self._path, "the file was replaced by another while this process had it open"
            )
        if st.st_size == 0:
            return faults.fault(faults.CORRUPT, self._path, "the file was emptied (0 bytes)")
        return None

    def _checkout_writer(self) -> tuple[None, sqlite3.Connection]:
        # Each thread keeps one write connection out of the pool: a pool checkout and its reset
        # cost a good part of a durable enqueue's latency. A thread's connection is
        # closed with the thread (its locals go), or by close(); a new pool (engine.dispose()) or
        # a forked child gets a new one.
        writer = getattr(self._local, "writer", None)
        if writer is not None and writer.pid == _pid and writer.driver.in_transaction:
            # Its transaction is still open: a write() inside another on this thread, which would
            # otherwise end the outer transaction and leave its rest to commit statement by statement.
            raise RuntimeError(
                "a tether write transaction is already open on this thread; nested writes are not supported"
            )
        if writer is None or writer.pool is not self.engine.pool or writer.pid != _pid:
            if writer is not None and writer.pid != _pid:
                _inherited.append(writer)
            raw = self.engine.raw_connection()  # the engine's connect-time PRAGMAs included
            driver: sqlite3.Connection | None = raw.driver_connection
            assert driver is not None  # None only once the connection is closed
            raw.detach()
            # Waits for the write lock are ours (_when_unlocked): SQLite's own busy handler first
            # sleeps a whole millisecond, and a worker woken by the WAL watch while the writer
            # that woke it is still syncing would always pay it.
            self._busy_timeout = driver.execute("PRAGMA busy_timeout").fetchone()[0] / 1000
            driver.execute("PRAGMA busy_timeout=0")
            writer = self._local.writer = _Writer(driver, self.engine.pool)
            self._writers.add(writer)
        return None, writer.driver

    def _when_unlocked(self, statement: Callable[[], _T]) -> _T:
        """Run ``statement`` (one that takes the write lock) as soon as the lock is free: retried
        after 50 us, doubling to 2 ms, until the busy timeout has passed."""
        deadline = None
        pause = 0.00005
        while True:
            try:
                return statement()
            except sqlite3.OperationalError as e:
                if not _busy(e):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._busy_timeout
                    self.lock_waits += 1  # a hint, not a count: threads may race on it
                elif now >= deadline:
                    raise
                time.sleep(min(pause, max(0.0, deadline - now)))
                pause = min(pause * 2, 0.002)

    def execute_alone(self, statement: str, values: Mapping[str, Any] | Sequence[Any]) -> int:
        # Outside BEGIN/COMMIT a statement commits itself, as durably: two round trips fewer.
        # ``values`` may be positional here (sql.INSERT_UNKEYED_ROW).
        try:
            _, driver = self._checkout_writer()
            try:
                return driver.execute(statement, values).rowcount
            except sqlite3.OperationalError as e:
                if not _busy(e):
                    raise
                return self._when_unlocked(lambda: driver.execute(statement, values).rowcount)
        except sqlite3.Error as e:
            raise self._wrap(e) from e

    def insert_alone(self, job: JobRecord) -> None:
        # Positional parameters (sql.INSERT_UNKEYED_ROW): the driver binds them without a dict.
        created = _sqlite_time(job.created_at)
        self.execute_alone(
            INSERT_UNKEYED_ROW,
            (
                job.id,
                job.type,
                job.payload,
                job.priority,
                job.max_attempts,
                created,
                created if job.run_at is job.created_at else _sqlite_time(job.run_at),
                job.parent_id,
                job.timeout,
                job.payload_bytes,
            ),
        )

    def close(self) -> None:
        for writer in list(self._writers):
            if writer.pid == _pid:
                writer.driver.close()
        self._writers.clear()
        self._local = threading.local()

    def bind(self, params: Mapping[str, Any]) -> dict[str, Any]:
        # The same fixed-width text SQLAlchemy's DateTime writes, so ``<`` is time order.
        return {k: _sqlite_time(v) if isinstance(v, datetime) else v for k, v in params.items()}

    time = staticmethod(_sqlite_time)

    def record(self, row: tuple[Any, ...]) -> JobRecord:
        return self.records([row])[0]

    def records(self, rows: list[tuple[Any, ...]]) -> list[JobRecord]:
        # A claimed batch shares its claim time and each job its created/run time: parse each
        # distinct text once.
        times: dict[str, datetime] = {}
        out = []
        for row in rows:
            values = list(row)
            values[3] = _STATUS[values[3]]
            for i in _TIME_COLUMNS:
                text = values[i]
                if text is not None:
                    when = times.get(text)
                    if when is None:
                        when = times[text] = datetime.fromisoformat(text).replace(tzinfo=_UTC)
                    values[i] = when
            out.append(make_tuple(JobRecord, values))  # JobRecord(*values) without its Python frame
        return out

    def _begin(self, cur: Any) -> None:
        # Take the write lock up front: a deferred transaction that upgrades later can fail with
        # "database is locked" without waiting for the busy timeout.
        self._when_unlocked(lambda: cur.execute("BEGIN IMMEDIATE"))

    def _commit(self, driver: sqlite3.Connection, cur: Any) -> None:
        cur.execute("COMMIT")  # the connection is in autocommit mode: BEGIN and COMMIT are ours

    def _rollback(self, driver: sqlite3.Connection, cur: Any) -> None:
        if driver.in_transaction:
            try:
                cur.execute("ROLLBACK")
            except sqlite3.Error:
                # A connection whose transaction cannot be ended is not used again.
                if getattr(getattr(self._local, "writer", None), "driver", None) is driver:
                    self._local.writer = None
                driver.close()


class PostgresBackend(Backend):
    name = "postgresql"

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        from .engine import schema_of

        # Qualified, so an application's session (whose search_path is its own) enqueues into
        # this ledger's schema too.
        schema = schema_of(engine)
        self._table = f'"{schema}".{TABLE}' if schema else None
        self._askers = threading.local()  # each thread's connection for ask()
        self._kept: list[Any] = []  # every such connection, closed with the backend
        self._kept_lock = threading.Lock()

    def sql(self, statement: str) -> str:
        return _pyformat(statement, self._table)

    def _end_read(self, driver: Any) -> None:
        driver.rollback()

    def ask(self, statement: str, params: Mapping[str, Any]) -> Any:
        """As ``Backend.ask``, in one round trip: on a connection of this thread's own, in
        autocommit, kept out of the pool (no checkout, no ping, no ROLLBACK). A worker asks the
        ledger whether it still holds a job before each effect, where a pooled read cost three
        round trips. A connection found dead is replaced once, as the pool's ping would: the
        statement only reads."""
        for again in (True, False):
            driver = self._asker()
            try:
                row = driver.execute(self.sql(statement), self.bind(params)).fetchone()
            except self._dbapi_error as e:
                if again and driver.closed:
                    continue
                raise self._wrap(e, driver) from e
            return None if row is None else row[0]
        raise AssertionError("unreachable")

    def _asker(self) -> Any:
        """This thread's connection for ``ask``, opened (or opened again) when needed."""
        driver = getattr(self._askers, "driver", None)
        if driver is not None and not driver.closed:
            return driver
        try:
            raw = self.engine.raw_connection()
        except self._dbapi_error as e:
            raise self._wrap(e) from e
        driver = raw.driver_connection
        raw.detach()  # the pool neither counts it nor resets it; close() closes it
        assert driver is not None  # None only once the connection is closed
        driver.autocommit = True
        self._askers.driver = driver
        with self._kept_lock:
            self._kept = [kept for kept in self._kept if not kept.closed] + [driver]
        return driver

    def close(self) -> None:
        with self._kept_lock:
            kept, self._kept = self._kept, []
        for driver in kept:
            driver.close()

    def _usable(self, driver: Any) -> bool:
        return not driver.closed  # psycopg: also after the server or the network cut it off


@cache
def _pyformat(statement: str, table: str | None = None) -> str:
    """``:name`` placeholders as psycopg's ``%(name)s``; the table schema-qualified if given;
    SQLite's index pins (``INDEXED BY``) taken out."""
    statement = unpinned(statement)
    if table:
        statement = _TABLE.sub(table, statement)
    return _NAMED.sub(r"%(\1)s", statement.replace("%", "%%"))


class _DBCursor(Protocol):
    """What tether uses of a DBAPI cursor (sqlite3's, psycopg's)."""

    rowcount: int

    def execute(self, statement: str, params: Any = ..., /) -> Any: ...
    def executemany(self, statement: str, rows: Any, /) -> Any: ...
    def fetchall(self) -> list[tuple[Any, ...]]: ...
    def fetchone(self) -> tuple[Any, ...] | None: ...


class _Cursor:
    """A driver cursor that speaks tether's named SQL and returns JobRecords."""

    __slots__ = ("_backend", "_cur")

    def __init__(self, backend: Backend, cur: _DBCursor) -> None:
        self._backend = backend
        self._cur = cur

    def execute(self, statement: str, params: Mapping[str, Any] | None = None) -> int:
        """Run a statement; returns the number of rows it changed."""
        self._cur.execute(self._backend.sql(statement), self._backend.bind(params or {}))
        return self._cur.rowcount

    def executemany(self, statement: str, rows: list[Mapping[str, Any]]) -> None:
        bind = self._backend.bind
        self._cur.executemany(self._backend.sql(statement), [bind(r) for r in rows])

    def records(self, statement: str, params: Mapping[str, Any] | None = None) -> list[JobRecord]:
        self._cur.execute(self._backend.sql(statement), self._backend.bind(params or {}))
        return self._backend.records(self._cur.fetchall())

    def rows(self, statement: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Plain rows, for reads that stream more than job records (reconcile)."""
        self._cur.execute(self._backend.sql(statement), self._backend.bind(params or {}))
        return self._cur.fetchall()

    def record(self, statement: str, params: Mapping[str, Any] | None = None) -> JobRecord | None:
        rows = self.records(statement, params)
        return rows[0] if rows else None

    def scalar(self, statement: str, params: Mapping[str, Any] | None = None) -> Any:
        self._cur.execute(self._backend.sql(statement), self._backend.bind(params or {}))
        row = self._cur.fetchone()
        return None if row is None else row[0]
