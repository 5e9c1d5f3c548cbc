"""A PostgreSQL enqueue's transaction as the server sees it: one round trip, COMMIT with the
statements; the wake-up NOTIFY after the COMMIT, in a transaction of its own that leaves the
next enqueue's commit durable; a wake-up that fails after the commit fails no enqueue."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest
import sqlalchemy as sa

from conftest import scratch_pg_database
from pgwire import kept_connection, sent_statements, statements, traced
from tether import Coordinator, CreateFile, JobStatus
from tether.ledger import wakeup


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Coordinator]:
    with scratch_pg_database("tether_commit") as url:
        with Coordinator.open(url, root=tmp_path / "data") as coordinator:
            coordinator.enqueue(CreateFile(path="first.json", content={}))  # opens the kept connection
            yield coordinator


def test_an_enqueue_is_one_round_trip_and_its_wake_up_follows_its_commit(c, tmp_path):
    _, messages = traced(c, tmp_path / "trace", lambda: c.enqueue(CreateFile(path="a.json", content={})))
    # One answer of the server's for the whole transaction: one round trip, as bare psycopg
    # would need three for BEGIN, INSERT and COMMIT.
    assert [m[2] for m in messages if m[0] == "B" and m[2].startswith("ReadyForQuery")] == ["ReadyForQuery"]
    assert statements(messages) == ["BEGIN", "INSERT", "COMMIT", "SELECT"]
    assert "pg_notify" in sent_statements(messages)[-1]  # the wake-up, after the COMMIT


def test_the_wake_up_leaves_the_enqueue_connection_committing_durably(c):
    c.enqueue(CreateFile(path="a.json", content={}))
    # The wake-up's own transaction does not wait for its flush; the setting must end with it,
    # or the next enqueue's commit would return before its job is durable.
    assert kept_connection(c).execute("SHOW synchronous_commit").fetchone() == ("on",)


def test_a_wake_up_that_fails_after_the_commit_fails_no_enqueue(c, monkeypatch, caplog):
    monkeypatch.setattr(wakeup, "NOTIFY_AFTER_COMMIT_SQL", "SELECT 1 / 0 WHERE %(channel)s <> %(token)s")
    caplog.set_level(logging.INFO, logger="tether.events")
    job = c.enqueue(CreateFile(path="a.json", content={})).job  # returns: the job is committed
    assert c.get(job.id).status is JobStatus.PENDING
    lost = [orjson.loads(r.getMessage()) for r in caplog.records if "after_commit_failed" in r.getMessage()]
    assert len(lost) == 1 and "division by zero" in lost[0]["error"]
    monkeypatch.undo()
    assert c.enqueue(CreateFile(path="b.json", content={})).job.status is JobStatus.PENDING  # the connection goes on


def test_a_transaction_run_statement_by_statement_sends_its_wake_up_after_its_commit(c):
    """The path a batch takes again after a refusal (not pipelined): the wake-up still comes once
    the transaction has committed, and only then."""
    backend = c.queue.backend
    dsn = sa.make_url(str(c.engine.url)).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {c.queue.wakeup.channel}")
        with pytest.raises(ZeroDivisionError):

            def fails(cur) -> None:
                c.queue.wakeup.notify_after_commit(cur)
                raise ZeroDivisionError

            backend.transact(fails)
        backend.transact(c.queue.wakeup.notify_after_commit)
        received = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert received == [c.queue.wakeup.token]
        assert list(listener.notifies(timeout=0.2)) == []  # the rolled-back one never came
