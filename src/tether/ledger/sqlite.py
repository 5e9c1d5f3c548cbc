"""The SQLite driver: one write connection per thread, kept out of the pool, and waits for the
write lock of our own (``_when_unlocked``)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa

from ..errors import LedgerFault
from . import faults, sqlitetime
from .backend import Backend, _Cursor
from .record import JobRecord, from_rows

_T = TypeVar("_T")


class _Writer:
    """One thread's write connection (a holder, since sqlite3 connections take no weak refs) and
    the cursor each of its transactions runs on."""

    __slots__ = ("driver", "cursor", "pool", "pid", "__weakref__")
    driver: sqlite3.Connection
    cursor: _WriteCursor
    pool: Any
    pid: int

    def __init__(self, backend: SQLiteBackend, driver: sqlite3.Connection, pool: Any) -> None:
        self.driver = driver
        self.cursor = _WriteCursor(backend, driver.cursor())
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
        self._spare: list[_Writer] = []  # write connections of finished threads (thread_done)
        self._busy_timeout = 30.0  # the engine's, read from the first write connection
        self._synced_full = True  # synchronous=FULL (durability "full"), read with it
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

    def _checkout_writer(self, pipelined: bool) -> tuple[None, sqlite3.Connection]:
        # Each thread keeps one write connection out of the pool: a pool checkout and its reset
        # cost a good part of a durable enqueue's latency. A thread's connection is
        # closed with the thread (its locals go), or by close(); a new pool (engine.dispose()) or
        # a forked child gets a new one.
        writer = getattr(self._local, "writer", None)
        if writer is not None and writer.pid == _pid and writer.cursor.in_use:
            # Its transaction is still open: a write() inside another on this thread, which would
            # otherwise end the outer transaction (or drop the insert it holds back) and leave its
            # rest to commit statement by statement.
            raise RuntimeError(
                "a tether write transaction is already open on this thread; nested writes are not supported"
            )
        if writer is None or writer.pool is not self.engine.pool or writer.pid != _pid:
            if writer is not None and writer.pid != _pid:
                _inherited.append(writer)
            writer = self._local.writer = self._handed_over() or self._new_writer()
        return None, writer.driver

    def _new_writer(self) -> _Writer:
        raw = self.raw_connection()  # the engine's connect-time PRAGMAs included
        driver: sqlite3.Connection | None = raw.driver_connection
        assert driver is not None  # None only once the connection is closed
        raw.detach()
        # Waits for the write lock are ours (_when_unlocked): SQLite's own busy handler first
        # sleeps a whole millisecond, and a worker woken by the WAL watch while the writer
        # that woke it is still syncing would always pay it.
        self._busy_timeout = driver.execute("PRAGMA busy_timeout").fetchone()[0] / 1000
        driver.execute("PRAGMA busy_timeout=0")
        self._synced_full = driver.execute("PRAGMA synchronous").fetchone()[0] == 2  # the ledger's durability
        writer = _Writer(self, driver, self.engine.pool)
        self._writers.add(writer)
        return writer

    def transact_unsynced(self, body: Callable[[_Cursor], _T], *, pipelined: bool = False) -> _T:
        # SQLite takes a connection's level for each transaction and refuses a change inside
        # one: it goes down before this transaction and back up after it.
        try:
            _, driver = self._checkout_writer(pipelined)
            if not self._synced_full:
                return self.transact(body, pipelined=pipelined)
            driver.execute(self.sql.COMMITS_UNSYNCED)
        except sqlite3.Error as e:
            raise self._wrap(e) from e
        try:
            return self.transact(body, pipelined=pipelined)
        finally:
            try:
                driver.execute(self.sql.COMMITS_SYNCED)
            except sqlite3.Error:
                # Left unsynced, the connection would commit every later transaction so: closed
                # instead, and this thread's next transaction opens another.
                if getattr(self._local, "writer", None) is not None and self._local.writer.driver is driver:
                    self._local.writer = None
                driver.close()

    def thread_done(self) -> None:
        # A worker's claiming threads end with each run: the next run's threads take their write
        # connections over instead of opening new ones (a connection's PRAGMAs and schema read
        # cost more than a whole run of a worker with nothing to do).
        writer = getattr(self._local, "writer", None)
        if writer is not None and writer.pid == _pid and not writer.cursor.in_use:
            self._local.writer = None
            self._spare.append(writer)

    def _handed_over(self) -> _Writer | None:
        """A write connection a finished thread left (``thread_done``), if one is still good."""
        while True:
            try:
                writer = self._spare.pop()
            except IndexError:
                return None
            if writer.pool is self.engine.pool and writer.pid == _pid:
                return writer

    def _when_unlocked(self, execute: Callable[..., _T], statement: str, *params: Any) -> _T:
        """``execute(statement, *params)``, a statement that takes the write lock, as soon as the lock is
        free: retried after 50 us, doubling to 2 ms, until the busy timeout has passed. SQLite's own busy
        handler cannot do this: its first sleep is a whole millisecond (which a worker woken by
        the WAL watch while the writer that woke it is still syncing would always pay), and it
        cannot tell this driver that it waited (``lock_waits``, by which a worker sizes its
        batches)."""
        deadline = None
        pause = 0.00005
        while True:
            try:
                return execute(statement, *params)
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

    def close(self) -> None:
        for writer in list(self._writers):
            if writer.pid == _pid:
                writer.driver.close()
        self._writers.clear()
        self._spare = []
        self._local = threading.local()

    def bind(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        # Times as the same fixed-width text SQLAlchemy's DateTime writes, so ``<`` is time order.
        # Most statements bind one time or none (insert_values gives its times bound already):
        # the parameters are copied only when one needs converting.
        bound = None
        for name, value in params.items():
            if isinstance(value, datetime):
                if bound is None:
                    bound = dict(params)
                bound[name] = sqlitetime.to_text(value)
        return params if bound is None else bound

    time = staticmethod(sqlitetime.to_text)

    def records(self, rows: list[tuple[Any, ...]]) -> list[JobRecord]:
        return from_rows(rows, sqlitetime.from_text)

    def _cursor(self, driver: sqlite3.Connection, pipelined: bool) -> _Cursor:
        cur: _WriteCursor = self._local.writer.cursor  # the writer just checked out: ``driver``'s
        cur.start(pipelined)
        return cur

    def _commit(self, driver: sqlite3.Connection, cur: Any) -> None:  # cur: a _WriteCursor
        if cur.begun:
            cur._cur.execute("COMMIT")  # the connection is in autocommit mode: BEGIN and COMMIT are ours
        elif cur.held is not None:  # the transaction's one statement, alone: its own transaction
            self._when_unlocked(cur._cur.execute, *cur.held)

    def _rollback(self, driver: sqlite3.Connection, cur: _Cursor) -> None:
        if driver.in_transaction:
            try:
                cur._cur.execute("ROLLBACK")
            except sqlite3.Error:
                # A connection whose transaction cannot be ended is not used again.
                if getattr(getattr(self._local, "writer", None), "driver", None) is driver:
                    self._local.writer = None
                driver.close()

    def insert_values(self, job: JobRecord) -> tuple[Any, ...]:
        # By position (sqlite.sql says which is which): the driver binds a tuple without making
        # and looking up each parameter's name. A job without keys ends before them: its insert
        # (INSERT_UNKEYED) takes no parameter for either, and one with a target but no
        # idempotency key (INSERT_ON_TARGET) none for the idempotency key.
        created_at = sqlitetime.to_text(job.created_at)
        values = (
            job.id,
            job.type,
            job.payload,
            job.priority,
            job.max_attempts,
            created_at,
            created_at if job.run_at is job.created_at else sqlitetime.to_text(job.run_at),
            job.parent_id or "",  # absences as values no job has (sqlite.sql: NULLIF)
            job.timeout or 0.0,
            job.payload_bytes,
            job.traceparent or "",
        )
        if job.idempotency_key is not None:
            return (*values, job.ordering_key, job.idempotency_key)
        return values if job.ordering_key is None else (*values, job.ordering_key)


class _WriteCursor(_Cursor):
    """The cursor of one of tether's own SQLite transactions. BEGIN IMMEDIATE goes just before its
    first statement (taking the write lock up front: a deferred transaction that upgrades later
    can fail with "database is locked" without waiting). In a pipelined transaction (an enqueue's
    group commit) a first statement that answers nothing, one row's insert, is held instead: if
    another follows, the transaction begins with it; if none does, it runs alone at the commit, as
    its own transaction, one statement where BEGIN, it and COMMIT would be three."""

    __slots__ = ("begun", "held", "in_use", "_may_hold")

    def __init__(self, backend: SQLiteBackend, cur: Any) -> None:
        self._backend = backend
        self._cur = cur
        self.begun = False
        self.held: tuple[str, Any] | None = None
        self.in_use = False
        self._may_hold = False

    def start(self, pipelined: bool) -> None:
        """Begin a transaction's use of this cursor (a writer runs each of its transactions on
        its one cursor, made with it); ``pipelined`` as ``Backend.transact`` says."""
        self.in_use = True
        self.begun = False
        self.held = None
        self._may_hold = pipelined

    def close(self) -> None:
        # The cursor stays open for the writer's next transaction: a statement of this one is
        # reset when the next runs (COMMIT or ROLLBACK ended it on this cursor).
        self.in_use = False

    def _begin(self) -> None:
        self.begun = True
        self._may_hold = False
        backend = self._backend
        assert isinstance(backend, SQLiteBackend)
        backend._when_unlocked(self._cur.execute, "BEGIN IMMEDIATE")
        if self.held is not None:
            self._cur.execute(*self.held)
            self.held = None

    def insert(self, statement: str, values: Any) -> None:
        if self._may_hold and not isinstance(values, list):  # executemany would commit row by row
            self._may_hold = False
            self.held = (statement, values)
            return
        if not self.begun:
            self._begin()
        _Cursor.insert(self, statement, values)

    def insert_returning(self, statement: str, values: Any) -> JobRecord | None:
        if not self.begun:
            self._begin()
        return _Cursor.insert_returning(self, statement, values)

    def execute(self, statement: str, params: Mapping[str, Any] | None = None) -> int:
        if not self.begun:
            self._begin()
        return _Cursor.execute(self, statement, params)

    def send(self, statement: str, params: Mapping[str, Any] | None = None) -> None:
        if not self.begun:
            self._begin()
        _Cursor.send(self, statement, params)

    def executemany(self, statement: str, rows: list[Mapping[str, Any]]) -> None:
        if not self.begun:
            self._begin()
        _Cursor.executemany(self, statement, rows)

    def records(self, statement: str, params: Mapping[str, Any] | None = None) -> list[JobRecord]:
        if not self.begun:
            self._begin()
        return _Cursor.records(self, statement, params)

    def rows(self, statement: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        if not self.begun:
            self._begin()
        return _Cursor.rows(self, statement, params)

    def scalar(self, statement: str, params: Mapping[str, Any] | None = None) -> Any:
        if not self.begun:
            self._begin()
        return _Cursor.scalar(self, statement, params)
