"""The driver-level write path: one write connection per thread on SQLite, closed with the ledger."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from tether import Coordinator
from jobkit import Note, NoteType, registry_with


def _writer(c: Coordinator) -> sqlite3.Connection:
    with c.queue.backend.write() as cur:
        return cur._cur.connection


def test_each_thread_writes_on_its_own_connection_and_reuses_it(tmp_path):
    with Coordinator.open(f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path / "data", registry=registry_with(NoteType())) as c:
        mine = _writer(c)
        assert _writer(c) is mine
        theirs = []
        t = threading.Thread(target=lambda: theirs.append(_writer(c)))
        t.start()
        t.join()
        assert theirs[0] is not mine
        # the thread's connection was set up like every other: WAL, FULL, busy timeout
        assert mine.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert mine.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_closing_the_ledger_closes_the_write_connections(tmp_path):
    c = Coordinator.open(f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path / "data", registry=registry_with(NoteType()))
    c.enqueue(Note(name="a"))
    conn = _writer(c)
    c.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        conn.execute("SELECT 1")


def test_a_disposed_pool_gives_the_thread_a_new_connection(tmp_path):
    with Coordinator.open(f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path / "data", registry=registry_with(NoteType())) as c:
        before = _writer(c)
        c.engine.dispose()  # e.g. to re-run connect-time set-up
        assert _writer(c) is not before
        assert c.enqueue(Note(name="a")).id
