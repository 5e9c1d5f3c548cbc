"""The driver: how the hot path (enqueue, claim, transitions, heartbeats, sweep) reaches the
database. One interface, ``Backend``, with a SQLite implementation (sqlite.py) and a PostgreSQL
one (postgresql.py); ``drivers.for_engine`` picks one. Each runs the statements of its dialect's
catalogue (catalogue.py) as written, on the DBAPI connection itself: SQLAlchemy's statement
execution costs many times a bare driver call, more than the fsync of a commit
(benchmarks/README.md, "Figures behind the code"). SQLAlchemy still owns the pool, the
connect-time set-up and every read that is not hot (the operator's reads, observe/).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa

from .. import events
from ..errors import LedgerFault
from . import conflict, faults
from .catalogue import Statements, catalogue_for
from .record import JobRecord, from_rows

_T = TypeVar("_T")


class Backend:
    """The driver-level access to one database; ``drivers.for_engine`` picks SQLite or PostgreSQL."""

    name = "base"
    one_machine = False
    """Whether every process on this ledger runs on one machine, sharing its clocks (SQLite: a
    ledger on local storage). Then a pause that stops one worker's clocks (a suspend, a paused
    VM) stops every worker, and no other can have taken its jobs meanwhile."""
    reads_json = True  # can read many rows from one JSON value (INSERT_PAYLOADS, COMPLETE_MANY...)
    commits_at_once = 1
    """How many group commits of enqueues (groupcommit.py) one process runs at a time."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.sql: Statements = catalogue_for(engine.dialect.name)
        """The statements this driver runs (its dialect's catalogue)."""
        dbapi = engine.dialect.loaded_dbapi
        self._dbapi_error = dbapi.Error
        self.refusals: tuple[type[Exception], ...] = (dbapi.IntegrityError, dbapi.DataError)
        """The driver's errors for a statement the database will not run on these values (a
        constraint, a value out of range): the statement's own fault, not the connection's."""
        self._then: dict[Any, tuple[str, Mapping[str, Any]]] = {}  # by driver connection: after_commit
        self.lock_waits = 0
        """Write transactions that found the ledger's write lock held and waited for it (SQLite:
        a whole-file lock; a worker claims larger batches while it is contended)."""

    # -- values and rows -----------------------------------------------------------------------

    def bind(self, params: Mapping[str, Any]) -> Mapping[str, Any]:
        """Named parameters as this driver takes them."""
        return params

    def time(self, value: datetime) -> Any:
        """A time as this driver stores it."""
        return value

    def insert_values(self, job: JobRecord) -> Any:
        """The values of INSERT (and INSERT_UNKEYED, INSERT_ON_TARGET) for a new ``job``, already
        bound: by name here (SQLite's, by position: sqlite.py)."""
        created_at = self.time(job.created_at)
        return {
            "id": job.id,
            "type": job.type,
            "payload": job.payload,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "created_at": created_at,
            # Most jobs may run as soon as they are enqueued (build gives them one time for both).
            "run_at": created_at if job.run_at is job.created_at else self.time(job.run_at),
            "idempotency_key": job.idempotency_key,
            "ordering_key": job.ordering_key,
            "parent_id": job.parent_id,
            "timeout": job.timeout,
            "payload_bytes": job.payload_bytes,
            "traceparent": job.traceparent,
        }

    def records(self, rows: list[tuple[Any, ...]]) -> list[JobRecord]:
        """The jobs of rows this driver read (record.from_rows)."""
        return from_rows(rows)

    # -- transactions --------------------------------------------------------------------------

    def transact(self, body: Callable[[_Cursor], _T], *, pipelined: bool = False) -> _T:
        """``body(cur)`` in one write transaction of tether's own, committed when it returns; run
        again whole, in a new transaction, when the database ends it to break a conflict with
        another one (a deadlock; conflict.py). ``body`` builds what it returns afresh on each
        run, so nothing of a run the database ended is kept. A lost connection raises
        LostConnection, or LostCommit when it was lost during COMMIT. ``pipelined``: the body
        runs by ``send`` each statement whose answer it does not read, so a driver may send
        those ahead of their answers, waiting only where the body reads one (PostgreSQL), or
        hold a lone insert back to run it as its own transaction (SQLite); a refusal may surface
        only when the body next reads an answer, or when the transaction ends. One function,
        not a context manager or two: every enqueue, claim and group commit runs it."""
        attempt = 1
        while True:
            try:
                raw, driver = self._checkout_writer(pipelined)
            except self._dbapi_error as e:
                raise self._wrap(e) from e
            committing = False
            try:
                cur = self._cursor(driver, pipelined)
                try:
                    result = body(cur)
                    committing = True
                    self._commit(driver, cur)
                except BaseException:
                    self._then.pop(driver, None)
                    self._rollback(driver, cur)
                    raise
                else:
                    if self._then:
                        self._then_run(driver, cur._cur)
                    return result
                finally:
                    cur.close()
            except self._dbapi_error as e:
                error = self._wrap(e, driver, committing=committing)
                if raw is not None:  # given back before a pause to run it again
                    self._give_back(raw, driver)
                    raw = None
                if not conflict.run_again(error, attempt):
                    raise error from e
            finally:
                if raw is not None:
                    self._give_back(raw, driver)
            attempt += 1

    def write(self, conn: Any) -> AbstractContextManager[_Cursor]:
        """A cursor in an application's transaction: ``conn`` is its SQLAlchemy connection, and
        what the cursor runs commits, or not, with the application's own rows."""
        return self._in_session(conn)

    @contextmanager
    def _in_session(self, conn: Any) -> Iterator[_Cursor]:
        cur = conn.connection.driver_connection.cursor()
        try:
            yield _Cursor(self, cur)
        except self._dbapi_error as e:
            raise self._wrap(e) from e
        finally:
            cur.close()

    def _checkout_writer(self, pipelined: bool) -> tuple[Any, Any]:
        """(pooled connection to return or None, driver connection) for one write transaction
        (``pipelined``: as ``transact`` says)."""
        raw = self.raw_connection()
        return raw, raw.driver_connection

    def raw_connection(self) -> Any:
        """A pooled connection; a driver error while opening one (the ledger's file is gone) is
        SQLAlchemy's, as every other error is."""
        try:
            return self.engine.raw_connection()
        except self._dbapi_error as e:
            raise self._wrap(e) from e

    def transact_unsynced(self, body: Callable[[_Cursor], _T], *, pipelined: bool = False) -> _T:
        """``transact(body)`` with a commit that does not wait for the disk (COMMITS_UNSYNCED),
        for rows a crash may take without harm (the register of workers): whole or not at all,
        and durable with the next durable commit, as the log is written in order."""

        def unsynced(cur: _Cursor) -> _T:
            cur.send(self.sql.COMMITS_UNSYNCED)
            return body(cur)

        return self.transact(unsynced, pipelined=pipelined)

    def thread_done(self) -> None:
        """The calling thread makes no more transactions: what is kept for it may serve another."""

    def close(self) -> None:
        """Close connections this backend holds outside the engine's pool."""

    def file_fault(self) -> LedgerFault | None:
        """A LedgerFault if the ledger's file is no longer the one this backend opened (a cheap
        check; PostgreSQL has no file of ours to watch)."""
        return None

    @contextmanager
    def read(self) -> Iterator[_Cursor]:
        """A cursor for a single consistent read (no write lock taken)."""
        raw = self.raw_connection()
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

    def _cursor(self, driver: Any, pipelined: bool) -> _Cursor:
        """The cursor of one of ``transact``'s transactions on ``driver``, begun (or, SQLite's,
        beginning with its first statement)."""
        return _Cursor(self, driver.cursor())

    def after_commit(self, cur: Any, statement: str, params: Mapping[str, Any]) -> None:
        """Run ``statement`` once the transaction of ``cur`` (one of ``transact``'s) has committed,
        in a transaction of its own: a wake-up sent there takes no lock held across the commit's
        flush. Its failure neither fails nor undoes that commit (what it sends is a hint)."""
        self._then[cur.connection] = (statement, params)

    def _then_run(self, driver: Any, cur: Any) -> None:
        then = self._then.pop(driver, None)
        if then is None:
            return
        try:
            cur.execute(*then)
            driver.commit()
        except self._dbapi_error as e:
            self._rollback(driver, cur)
            events.emit("after_commit_failed", error=faults.describe(e))

    def _commit(self, driver: Any, cur: _Cursor) -> None:
        driver.commit()

    def _rollback(self, driver: Any, cur: _Cursor) -> None:
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

    def wrap(self, error: Exception) -> sa.exc.StatementError:
        """A driver error raised by a statement, as SQLAlchemy's (IntegrityError...)."""
        return self._wrap(error)

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


class Answer:
    """The rows of a statement run by ``_Cursor.later``, read when first asked for. In a
    pipelined transaction they come with the answers of what was sent after the statement: at
    the latest with the COMMIT's, and ``Backend.transact`` has read every one before it returns.
    Asked for before then, they cost a round trip of their own."""

    __slots__ = ("_backend", "_cur", "_rows")

    def __init__(self, backend: Backend, cur: Any = None, rows: list[tuple[Any, ...]] | None = None) -> None:
        self._backend = backend
        self._cur = cur  # the driver cursor the statement ran on, until its rows are read
        self._rows = rows

    def rows(self) -> list[tuple[Any, ...]]:
        if self._rows is None:
            self._rows = self._cur.fetchall()
            self._cur.close()
            self._cur = None
        return self._rows

    def records(self) -> list[JobRecord]:
        return self._backend.records(self.rows())

    def close(self) -> None:
        """Drop the rows of a transaction that did not commit."""
        if self._cur is not None:
            self._cur.close()


class _DBCursor(Protocol):
    """What tether uses of a DBAPI cursor (sqlite3's, psycopg's)."""

    rowcount: int

    def execute(self, statement: str, params: Any = ..., /) -> Any: ...
    def executemany(self, statement: str, rows: Any, /) -> Any: ...
    def fetchall(self) -> list[tuple[Any, ...]]: ...
    def fetchone(self) -> tuple[Any, ...] | None: ...
    def close(self) -> None: ...


class _Cursor:
    """A driver cursor that runs catalogue statements and returns JobRecords."""

    __slots__ = ("_backend", "_cur")

    def __init__(self, backend: Backend, cur: _DBCursor) -> None:
        self._backend = backend
        self._cur = cur

    def execute(self, statement: str, params: Mapping[str, Any] | None = None) -> int:
        """Run a statement; returns the number of rows it changed."""
        self._cur.execute(statement, self._backend.bind(params or {}))
        return self._changed()

    def _changed(self) -> int:
        """The number of rows the last statement changed."""
        return self._cur.rowcount

    def later(self, statement: str, params: Mapping[str, Any] | None = None) -> Answer:
        """Run a statement whose rows the transaction may read later, or only once it has
        committed: in a pipelined transaction it goes without waiting for them (``Answer``)."""
        return self._later(statement, params)

    def _later(self, statement: str, params: Mapping[str, Any] | None) -> Answer:
        return Answer(self._backend, rows=self.rows(statement, params))

    def send(self, statement: str, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement whose answer the transaction does not read: in a pipelined
        transaction (``Backend.transact``) it goes without waiting for one, where ``execute``
        waits for the count of rows changed."""
        self._cur.execute(statement, self._backend.bind(params or {}))

    def executemany(self, statement: str, rows: list[Mapping[str, Any]]) -> None:
        bind = self._backend.bind
        self._cur.executemany(statement, [bind(r) for r in rows])

    def after_commit(self, statement: str, params: Mapping[str, Any]) -> None:
        self._backend.after_commit(self._cur, statement, params)

    def close(self) -> None:
        """The end of this cursor's transaction (``Backend.transact``)."""
        self._cur.close()

    def insert(self, statement: str, values: Mapping[str, Any] | list[Mapping[str, Any]]) -> None:
        """An insert of ``Backend.insert_values`` (one row, or a list of them), already bound."""
        if isinstance(values, list):
            self._cur.executemany(statement, values)
        else:
            self._cur.execute(statement, values)

    def insert_returning(self, statement: str, values: Any) -> JobRecord | None:
        """A keyed insert of ``Backend.insert_values``, already bound: the job inserted, or None."""
        self._cur.execute(statement, values)
        rows = self._backend.records(self._cur.fetchall())
        return rows[0] if rows else None

    def records(self, statement: str, params: Mapping[str, Any] | None = None) -> list[JobRecord]:
        self._cur.execute(statement, self._backend.bind(params or {}))
        return self._backend.records(self._cur.fetchall())

    def rows(self, statement: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Plain rows, for reads that stream more than job records (reconcile)."""
        self._cur.execute(statement, self._backend.bind(params or {}))
        return self._cur.fetchall()

    def record(self, statement: str, params: Mapping[str, Any] | None = None) -> JobRecord | None:
        rows = self.records(statement, params)
        return rows[0] if rows else None

    def scalar(self, statement: str, params: Mapping[str, Any] | None = None) -> Any:
        self._cur.execute(statement, self._backend.bind(params or {}))
        row = self._cur.fetchone()
        return None if row is None else row[0]
