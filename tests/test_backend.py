"""The driver-level write path: one write connection per thread on SQLite, closed with the ledger."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import scratch_pg_database
from jobkit import Note, NoteType, registry_with
from tether import Coordinator
from tether.ledger.sqlite import SQLiteBackend


@pytest.fixture
def ledger(tmp_path) -> Iterator[Coordinator]:
    """A SQLite ledger (``l.db`` under ``tmp_path``) with the Note type."""
    with Coordinator.open(
        f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path / "data", registry=registry_with(NoteType())
    ) as c:
        yield c


def _writer(c: Coordinator) -> sqlite3.Connection:
    # sqlite3's connection; not in tether's cursor Protocol
    return c.queue.backend.transact(lambda cur: cur._cur.connection)  # type: ignore[attr-defined]


def test_each_thread_writes_on_its_own_connection_and_reuses_it(ledger):
    mine = _writer(ledger)
    assert _writer(ledger) is mine
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(_writer(ledger)))
    t.start()
    t.join()
    assert theirs[0] is not mine
    # the thread's connection was set up like every other: WAL, FULL, busy timeout, and
    # statement journals in memory (not a temp file made and deleted per batch)
    assert mine.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert mine.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert mine.execute("PRAGMA temp_store").fetchone()[0] == 2


def test_closing_the_ledger_closes_the_write_connections(tmp_path):
    c = Coordinator.open(f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path / "data", registry=registry_with(NoteType()))
    c.enqueue(Note(name="a"))
    conn = _writer(c)
    c.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")


@pytest.fixture
def own_pg_database() -> Iterator[str]:
    """A database of this test's own: the session's is shared with tests whose ledgers record
    another data root."""
    with scratch_pg_database("tether_backend") as url:
        yield url


def test_closing_a_postgresql_ledger_mid_enqueue_closes_that_enqueues_connection_once_it_commits(
    own_pg_database, tmp_path, monkeypatch
):
    """An enqueue's transaction runs on a connection kept out of the pool; a close() that comes
    while one is in flight (another thread's, at that instant) closes it as the enqueue gives it
    back, after its commit, rather than keeping it idle for a ledger no one will use."""
    pg_database = own_pg_database
    c = Coordinator.open(pg_database, root=tmp_path / "data", registry=registry_with(NoteType()))
    backend = c.queue.backend
    in_flight = []
    commit = type(backend)._commit

    def close_meanwhile(self, driver, cur):
        in_flight.append(driver)
        c.close()
        commit(self, driver, cur)  # the transaction's one round trip, after the close

    monkeypatch.setattr(type(backend), "_commit", close_meanwhile)
    job = c.enqueue(Note(name="a"))
    monkeypatch.undo()
    assert len(in_flight) == 1 and in_flight[0].closed
    with Coordinator.open(pg_database, root=tmp_path / "data", registry=registry_with(NoteType())) as again:
        assert again.get(job.id) is not None  # committed before its connection closed


def test_a_disposed_pool_gives_the_thread_a_new_connection(ledger):
    before = _writer(ledger)
    ledger.engine.dispose()  # e.g. to re-run connect-time set-up
    assert _writer(ledger) is not before
    assert ledger.enqueue(Note(name="a")).id


def _hold_write_lock(path) -> sqlite3.Connection:
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's writer, mid-transaction
    return other


def test_a_write_waits_for_the_write_lock_in_short_steps_and_goes_on_when_it_is_free(tmp_path, ledger, monkeypatch):
    ledger.enqueue(Note(name="warm"))  # the thread's write connection exists
    other = _hold_write_lock(tmp_path / "l.db")
    pauses = []

    def sleep(seconds):
        pauses.append(seconds)
        if len(pauses) == 3:
            other.rollback()  # the other writer finishes

    monkeypatch.setattr("tether.ledger.sqlite.time.sleep", sleep)
    job = ledger.enqueue(Note(name="a"))
    assert pauses == [0.00005, 0.0001, 0.0002]  # not SQLite's first whole-millisecond sleep
    assert ledger.get(job.id).status.value == "pending"
    other.close()


def test_a_write_lock_held_past_the_busy_timeout_fails_the_enqueue_cleanly(tmp_path, ledger, monkeypatch):
    from tether.errors import DatabaseUnavailable

    ledger.enqueue(Note(name="warm"))
    assert isinstance(ledger.queue.backend, SQLiteBackend)
    ledger.queue.backend._busy_timeout = 0.05
    other = _hold_write_lock(tmp_path / "l.db")
    try:
        with pytest.raises(DatabaseUnavailable, match="database is locked"):
            ledger.enqueue(Note(name="a"))
        with pytest.raises(Exception, match="database is locked"):
            ledger.queue.claim("w")
    finally:
        other.close()
    with ledger.engine.connect() as conn:  # nothing half written
        assert conn.exec_driver_sql("SELECT count(*) FROM tether_jobs").scalar() == 1


@pytest.mark.parametrize("pipelined", [False, True], ids=["begun", "insert_held_back"])
def test_a_write_inside_another_on_one_thread_is_refused_and_the_outer_one_survives(ledger, pipelined):
    # Pipelined, the outer transaction has begun nothing yet (its one insert is held back on the
    # thread's write cursor, which the inner one would otherwise start afresh).
    [job] = ledger.queue.enqueuer.build([Note(name="a")])

    def outer(cur: Any) -> None:
        ledger.queue.enqueuer.insert_all(cur, [job])
        with pytest.raises(RuntimeError, match="nested writes are not supported"):
            ledger.queue.backend.transact(lambda _: None)

    ledger.queue.backend.transact(outer, pipelined=pipelined)
    assert ledger.get(job.id).status.value == "pending"


def test_a_forked_child_leaves_the_parents_write_connections_alone(ledger):
    import os

    parent = _writer(ledger)
    pid = os.fork()
    if pid == 0:  # the child: its own connection, the parent's untouched
        try:
            ok = _writer(ledger) is not parent and ledger.enqueue(Note(name="child")).id is not None
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent.execute("SELECT count(*) FROM tether_jobs").fetchone()[0] == 1  # still open, sees the child's job
    assert ledger.enqueue(Note(name="parent")).id


def test_a_time_is_stored_as_its_full_utc_text_and_read_back_exactly():
    # Every time on either side of a boundary (second, minute, day, year) reads back exactly.
    from datetime import UTC, datetime, timedelta, timezone

    from tether.ledger.sqlitetime import from_text, to_text

    start = datetime(2026, 12, 31, 23, 59, 58, 999_990, tzinfo=UTC)
    times = [start + timedelta(microseconds=7 * i) for i in range(300_000)]  # 2.1 s: three seconds
    times += [datetime(2026, 3, 1, 12, 0, 0, 5, tzinfo=UTC), start, times[-1]]  # back, and forth
    for when in times:
        assert to_text(when) == when.replace(tzinfo=None).isoformat(" ", "microseconds")
        assert from_text(to_text(when)) == when
    # a time in another zone is converted to UTC
    plus_one = timezone(timedelta(hours=1))
    assert to_text(datetime(2027, 1, 1, 0, 59, 59, 1, tzinfo=plus_one)) == "2026-12-31 23:59:59.000001"
    with pytest.raises(ValueError, match="timezone-aware"):
        to_text(datetime(2027, 1, 1, 0, 0, 0, 1))


def test_a_sqlite_ledger_never_loads_the_postgresql_driver(tmp_path):
    """Opening a SQLite ledger and enqueueing in a fresh interpreter leaves psycopg unimported:
    its import would be most of a short-lived process's first enqueue."""
    code = (
        "import sys; from pathlib import Path; from tether import Coordinator, CreateFile;"
        f"c = Coordinator.open('sqlite:///{tmp_path}/l.db', root=Path('{tmp_path}/root'));"
        "c.enqueue(CreateFile(path='a.json', content='{}'));"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def statements(sent: list[str]) -> list[str]:
    """The first word of each statement the trace callback saw, each text once: the callback
    reports a statement again for every trigger program it runs (tether_targets' triggers on
    tether_jobs run for every insert of a job, whatever their WHEN clause decides)."""
    return [s.split()[0] for s in dict.fromkeys(sent)]


def test_a_lone_enqueue_on_sqlite_is_one_insert_that_is_its_own_transaction(ledger):
    # BEGIN IMMEDIATE, the insert and COMMIT would be three statements where one does.
    sent: list[str] = []
    _writer(ledger).set_trace_callback(sent.append)
    result = ledger.enqueue(Note(name="a"))
    assert statements(sent) == ["INSERT"]
    assert ledger.get(result.id).status.value == "pending"


def test_an_enqueue_of_more_than_one_statement_on_sqlite_commits_them_together_or_not_at_all(ledger):
    # The first insert is held back; the statement after it begins the transaction it joins.
    sent: list[str] = []
    _writer(ledger).set_trace_callback(sent.append)
    tagged = ledger.enqueue(Note(name="a"), tags=["t"])
    assert statements(sent) == ["BEGIN", "INSERT", "INSERT", "COMMIT"]
    assert ledger.get(tagged.id).status.value == "pending"
    [job] = ledger.queue.enqueuer.builder.build([Note(name="b")])

    def insert_then_fail(cur: Any) -> None:
        ledger.queue.enqueuer.insert_all(cur, [job])
        cur.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(Exception, match="no such table"):
        ledger.queue.backend.transact(insert_then_fail, pipelined=True)
    with ledger.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM tether_jobs").scalar() == 1  # the tagged one


def test_a_sqlite_jobs_absent_parent_timeout_and_traceparent_are_stored_as_null(ledger):
    # The inserts send them as values no job has ('' and 0); the statement makes those NULL.
    plain = ledger.enqueue(Note(name="a")).job
    timed = ledger.enqueue(Note(name="b"), timeout=2.5).job
    with ledger.engine.connect() as conn:
        rows: dict[str, str] = dict(
            conn.exec_driver_sql(
                "SELECT id, json_array(parent_id IS NULL, timeout IS NULL, traceparent IS NULL, timeout)"
                " FROM tether_jobs"
            ).all()
        )
    assert rows[plain.id] == "[1,1,1,null]"
    assert rows[timed.id] == "[1,0,1,2.5]"
    assert ledger.get(plain.id).timeout is None and ledger.get(timed.id).timeout == 2.5
