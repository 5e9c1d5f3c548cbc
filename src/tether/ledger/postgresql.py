"""The PostgreSQL driver: pooled connections for writes; connections kept out of the pool, in
pipeline mode, for enqueues' group commits (``transact(pipelined=True)``); and one connection per
thread, in autocommit, for the worker's one-statement questions (``ask``)."""

from __future__ import annotations

import os
import select
import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import pq

from .. import events
from . import faults
from .backend import Answer, Backend, _Cursor

# A ledger in its own schema (engine.create_engine): an application's transaction has the
# ledger's schema put alone on its search path for the span of tether's statements in it, as
# tether's own connections have from their start; then its own path is put back.
_ENTER_SCHEMA = "SELECT current_setting('search_path'), set_config('search_path', %s, true)"
_LEAVE_SCHEMA = "SELECT set_config('search_path', %s, true)"


_KEPT = object()  # the "pooled connection" of a pipelined transaction's kept connection


def _alive(driver: Any) -> bool:
    """Whether an idle connection still stands, told without a round trip: a server that ended it
    (a restart, an administrator's terminate) has said so on its socket, which is then readable.
    Nothing else comes unasked to a connection that does not LISTEN, and reading the farewell
    does not always reach the end of the stream: a readable one is not used again."""
    if driver.closed:
        return False
    try:
        return not select.select([driver.pgconn.socket], [], [], 0)[0]
    except (OSError, ValueError):
        return False


class _PipelinedCursor(_Cursor):
    """The cursor of a pipelined transaction: ``send`` and ``later`` go without waiting for an
    answer, and a statement whose answer is read (rows, ``execute``'s count, an ``Answer`` asked
    for) waits for it, and so for those sent before it."""

    __slots__ = ("_driver", "_pipe", "answers")

    def __init__(self, backend: Backend, driver: Any, pipe: Any) -> None:
        super().__init__(backend, driver.cursor())
        self._driver = driver
        self._pipe = pipe
        self.answers: list[Answer] = []  # read once the transaction has committed (_commit)

    def _later(self, statement: str, params: Mapping[str, Any] | None) -> Answer:
        cur = self._driver.cursor()  # a cursor keeps the answer of its last statement only
        answer = Answer(self._backend, cur)
        self.answers.append(answer)
        cur.execute(statement, self._backend.bind(params or {}))
        return answer

    def close(self) -> None:
        for answer in self.answers:
            answer.close()
        super().close()

    def _changed(self) -> int:
        self._pipe.sync()  # the count comes with the answer (a Sync ends no explicit transaction)
        return self._cur.rowcount


class PostgresBackend(Backend):
    name = "postgresql"
    # The process groups its callers' enqueues (fewer transactions: less work for both sides);
    # a second group commit sends its statements while the first commits, and the server's own
    # grouping shares their flushes.
    commits_at_once = 2

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        from .engine import schema_of

        schema = schema_of(engine)
        self._search_path = f'"{schema}"' if schema else None
        self._askers = threading.local()  # each thread's connection for ask()
        self._kept: list[Any] = []  # every such connection, closed with the backend
        self._kept_lock = threading.Lock()
        # Pipelined transactions' connections (enqueues' group commits, workers' claims and
        # completions), idle between them: kept up to as many as the engine's pool keeps.
        self._idle: list[Any] = []
        size = getattr(engine.pool, "size", None)
        self._keep = max(self.commits_at_once, size() if callable(size) else 0)
        self._pipelined: weakref.WeakSet[Any] = weakref.WeakSet()  # every such connection
        self._pipes: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # in a transaction
        self._pid = os.getpid()
        self._closed = False  # once closed, a kept connection in use is closed when given back

    def _checkout_writer(self, pipelined: bool) -> tuple[Any, Any]:
        # A pipelined transaction (an enqueue's, a worker's claim or group commit) sends BEGIN
        # with the statements that follow it, on a connection kept for it: no pool checkout, no
        # ping, no reset. A dead one is told by its socket (_alive).
        if not pipelined:
            return super()._checkout_writer(pipelined)
        if os.getpid() != self._pid:  # a forked child: the parent's connections are not its own
            self._pid, self._idle = os.getpid(), []
        with self._kept_lock:
            while self._idle:
                driver = self._idle.pop()
                if _alive(driver):
                    return _KEPT, driver
                driver.close()
        raw = self.raw_connection()
        driver = raw.driver_connection
        raw.detach()  # the pool neither counts it nor resets it; _give_back or close() closes it
        # In autocommit the driver sends no BEGIN of its own, which in pipeline mode it would
        # wait on: _cursor sends it in the pipeline, and COMMIT ends what it began.
        driver.autocommit = True
        self._pipelined.add(driver)
        return _KEPT, driver

    def _cursor(self, driver: Any, pipelined: bool) -> _Cursor:
        if driver not in self._pipelined:
            return super()._cursor(driver, pipelined)
        # Statements are sent without waiting for their answers.
        entered = driver.pipeline()
        pipe = entered.__enter__()
        self._pipes[driver] = entered
        cur = _PipelinedCursor(self, driver, pipe)
        try:
            cur.send("BEGIN")
        except BaseException:
            self._rollback(driver, cur)
            cur.close()
            raise
        return cur

    def _commit(self, driver: Any, cur: _Cursor) -> None:
        entered = self._pipes.get(driver)
        if entered is None:
            driver.commit()
            return
        # COMMIT goes with the statements, and the wake-up after it as a transaction of its own:
        # the whole transaction is one round trip, and its answer comes once the commit is
        # durable. An error of any statement is raised here, where the connection's loss
        # leaves the commit's fate unknown (the COMMIT was sent).
        raw: Any = cur._cur  # psycopg's cursor
        raw.execute("COMMIT")
        then = self._then.pop(driver, None)
        if then is not None:
            raw.execute(*then)
        del self._pipes[driver]
        try:
            entered.__exit__(None, None, None)  # one Sync: every answer, the first error raised
        except self._dbapi_error as e:
            # A cursor keeps the last answer that was no error: COMMIT's, if the commit stands.
            if raw.statusmessage != "COMMIT":
                raise
            events.emit("after_commit_failed", error=faults.describe(e))  # committed: a lost hint
        assert isinstance(cur, _PipelinedCursor)
        for answer in cur.answers:  # all here: read before the connection serves another transaction
            answer.rows()

    def _rollback(self, driver: Any, cur: _Cursor) -> None:
        entered = self._pipes.pop(driver, None)
        if entered is not None:
            try:
                entered.__exit__(None, None, None)
            except self._dbapi_error:
                pass  # the error being raised already says it, or the connection is gone
        super()._rollback(driver, cur)

    def _give_back(self, raw: Any, driver: Any) -> None:
        if raw is not _KEPT:
            super()._give_back(raw, driver)
            return
        with self._kept_lock:
            if not self._closed and self._usable(driver) and len(self._idle) < self._keep:
                self._idle.append(driver)
                return
        driver.close()

    @contextmanager
    def _in_session(self, conn: Any) -> Iterator[_Cursor]:
        if self._search_path is None:
            with super()._in_session(conn) as cur:
                yield cur
            return
        driver = conn.connection.driver_connection
        with driver.cursor() as raw:
            raw.execute(_ENTER_SCHEMA, (self._search_path,))
            row = raw.fetchone()
        try:
            with super()._in_session(conn) as cur:
                yield cur
        finally:
            # A failed transaction takes no statement; its rollback puts the path back.
            if row is not None and driver.info.transaction_status != pq.TransactionStatus.INERROR:
                with driver.cursor() as raw:
                    raw.execute(_LEAVE_SCHEMA, (row[0],))

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
                row = driver.execute(statement, params).fetchone()
            except self._dbapi_error as e:
                if again and _gone(driver, e):
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
            self._closed = True
            kept, self._kept = self._kept, []
            kept += self._idle if self._pid == os.getpid() else []
            self._idle = []
        for driver in kept:
            driver.close()

    def _usable(self, driver: Any) -> bool:
        return not driver.closed  # psycopg: also after the server or the network cut it off

    def _wrap(self, error: Exception, driver: Any = None, *, committing: bool = False) -> sa.exc.StatementError:
        # A connection whose session ``error`` ended is closed first, so that it is neither used
        # again nor given back to the pool, and the error is told as the lost connection it is:
        # during COMMIT, one whose outcome is unknown (LostCommit), not a refusal that left
        # nothing behind.
        if driver is not None:
            _gone(driver, error)
        return super()._wrap(error, driver, committing=committing)


def _gone(driver: Any, error: Exception) -> bool:
    """Whether ``driver``'s connection is lost after ``error``: closed by psycopg, or closed here
    because the error ended its session before psycopg read the socket's end."""
    if not driver.closed and _ends_session(error):
        driver.close()
    return bool(driver.closed)


def _ends_session(error: Exception) -> bool:
    """Whether ``error`` ends its session although psycopg may read the socket's end only later:
    the driver's own errors (no SQLSTATE: the socket cut, or a pipeline's protocol lost with it,
    "cannot exit pipeline mode while busy") and the server's connection classes (08: connection
    exception; 57P0x: terminated by an administrator, shut down). Any other SQLSTATE is a
    statement's refusal, after which the session goes on."""
    if not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate
    return state is None or state.startswith(("08", "57P0"))
