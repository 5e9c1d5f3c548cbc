"""A worker's lease check on PostgreSQL: one round trip on a connection of the thread's own, kept
out of the pool, replaced when the server drops it, closed with the coordinator."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile
from tether.ledger.postgresql import PostgresBackend

pytestmark = pytest.mark.parametrize("db_url", ["postgres"], indirect=True)


@pytest.fixture
def pg(make_coordinator) -> Coordinator:
    return make_coordinator()


def asker(c: Coordinator) -> int:
    """The server process of this thread's lease-check connection."""
    backend = c.queue.backend
    assert isinstance(backend, PostgresBackend)
    return int(backend._askers.driver.info.backend_pid)


def backends(url: str) -> set[int]:
    """The server processes connected to the test's database, other than this query's."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return set(
                conn.exec_driver_sql(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).scalars()
            )
    finally:
        engine.dispose()


def test_a_lease_check_dropped_by_the_server_is_asked_again_on_a_new_connection(pg: Coordinator, db_url: str):
    pg.enqueue(CreateFile(path="a.json", content=1))
    [job] = pg.queue.claim("w")
    assert pg.queue.holds(job, "w")
    first = asker(pg)
    terminate = sa.create_engine(db_url)
    with terminate.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({first})").scalar() is True
    terminate.dispose()
    assert pg.queue.holds(job, "w")  # no error: the read is made again on a new connection
    assert not pg.queue.holds(job, "another worker")
    assert asker(pg) != first


def test_a_lease_check_whose_session_ended_before_the_driver_saw_it_is_asked_again(pg: Coordinator, monkeypatch):
    """The server's "terminating connection" read before the socket's end: psycopg has not marked
    the connection closed yet, and it is replaced all the same, not given the next question."""
    pg.enqueue(CreateFile(path="a.json", content=1))
    [job] = pg.queue.claim("w")
    backend = pg.queue.backend
    assert isinstance(backend, PostgresBackend)

    class Ended:
        closed = False

        def execute(self, *args: object, **kwargs: object) -> None:
            raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")

        def close(self) -> None:
            self.closed = True

    ended, real = Ended(), backend._asker
    handed: list[object] = []

    def asker() -> object:
        handed.append(ended if not handed else real())
        return handed[-1]

    monkeypatch.setattr(backend, "_asker", asker)
    assert pg.queue.holds(job, "w")  # no error: asked again on a new connection
    assert ended.closed and len(handed) == 2


def test_the_lease_check_connections_close_with_the_coordinator(db_url: str, root, clock):
    before = backends(db_url)
    c = Coordinator.open(db_url, root=root, clock=clock)
    c.enqueue(CreateFile(path="a.json", content=1))
    [job] = c.queue.claim("w")
    assert c.queue.holds(job, "w")
    pid = asker(c)
    assert pid in backends(db_url)
    c.close()
    assert pid not in backends(db_url) and backends(db_url) <= before
