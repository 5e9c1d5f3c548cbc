"""LISTEN/NOTIFY wake-ups (tether.ledger.wakeup.PgWakeup): fast pick-up across processes, and the poll
interval as the fallback when notifications are lost."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import sqlalchemy as sa

from tether import Coordinator, JobStatus
from tether.jobtypes import default_registry
from tether.ledger.engine import create_engine
from tether.ledger.wakeup import DEFAULT_CHANNEL, PgWakeup, Wakeup, wakeup_for

REPO = Path(__file__).resolve().parent.parent


import pg_jobtypes  # noqa: E402  (tests/ is on sys.path, as for jobkit)

LISTEN_SQL = f"LISTEN {DEFAULT_CHANNEL}"
T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.01) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def pg_url(pg_database: str) -> Iterator[str]:
    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_jobs")
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_meta")
    engine.dispose()
    yield pg_database


@pytest.fixture
def engines(pg_url: str) -> Iterator[Callable[[], sa.Engine]]:
    made: list[sa.Engine] = []

    def make() -> sa.Engine:
        made.append(create_engine(pg_url))
        return made[-1]

    yield make
    for e in made:
        e.dispose()


def listener_pids(engine: sa.Engine) -> list[int]:
    """Backends of this database whose last statement was our LISTEN (idle listeners)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = :q"),
            {"q": LISTEN_SQL},
        ).all()
    return [r[0] for r in rows]


# -- in-process ------------------------------------------------------------------------------


def test_wakeup_for_picks_listen_notify_on_postgres_only(engines, tmp_path: Path) -> None:
    pg = wakeup_for(engines())
    lite_engine = create_engine(f"sqlite:///{tmp_path / 'l.db'}")
    try:
        lite = wakeup_for(lite_engine)
        assert isinstance(pg, PgWakeup)
        assert type(lite) is Wakeup
    finally:
        lite_engine.dispose()
        pg.close()


class _TextCursor:
    """The cursor contract notify_in needs (``send(sql, params)`` with the driver's own
    ``%(name)s`` binds), over a SQLAlchemy connection."""

    def __init__(self, conn: sa.Connection) -> None:
        self.conn = conn

    def send(self, statement: str, params: dict) -> None:
        self.conn.exec_driver_sql(statement, params)


def send(wakeup: PgWakeup) -> None:
    """What an enqueue does: NOTIFY inside a committed transaction."""
    with wakeup.engine.begin() as conn:
        wakeup.notify_in(_TextCursor(conn))


def test_notify_on_one_connection_wakes_a_listener_on_another(engines) -> None:
    listener, sender = PgWakeup(engines()), PgWakeup(engines())
    try:
        listener.start()
        assert listener.listening.wait(10), "listener never connected"
        seen = listener.generation()
        t0 = time.monotonic()
        send(sender)
        assert listener.wait(seen, 5.0)
        assert time.monotonic() - t0 < 1.0
    finally:
        listener.close()
        sender.close()


def test_notify_in_a_transaction_is_delivered_only_if_it_commits(engines, pg_url: str) -> None:
    import psycopg

    engine = engines()
    rolled_back, committed = PgWakeup(engine, listen=False), PgWakeup(engine, listen=False)
    dsn = sa.make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {DEFAULT_CHANNEL}")
        with engine.connect() as conn:
            with conn.begin() as tx:
                rolled_back.notify_in(_TextCursor(conn))
                tx.rollback()
            with conn.begin():
                committed.notify_in(_TextCursor(conn))
        # Had the rolled-back NOTIFY leaked, it would arrive first (it was sent first).
        received = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert received == [committed.token]


def test_listener_reconnects_after_its_connection_is_killed(engines) -> None:
    admin = engines()
    listener, sender = PgWakeup(engines(), max_backoff=0.5), PgWakeup(engines())
    try:
        listener.start()
        assert listener.listening.wait(10)
        (old_pid,) = wait_until(lambda: listener_pids(admin), 5, "the LISTEN backend")
        before = listener.generation()
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": old_pid})
        new_pids = wait_until(lambda: [p for p in listener_pids(admin) if p != old_pid], 10, "a new LISTEN backend")
        assert len(new_pids) == 1
        # Notifications sent while disconnected are lost, so a reconnect itself wakes waiters.
        wait_until(lambda: listener.generation() > before, 5, "the reconnect wake-up")
        seen = listener.generation()
        send(sender)
        assert listener.wait(seen, 5.0), "no wake-up after the reconnect"
    finally:
        listener.close()
        sender.close()


def test_close_stops_the_listener_and_releases_its_connection(engines) -> None:
    admin = engines()
    listener = PgWakeup(engines())
    listener.start()
    assert listener.listening.wait(10)
    wait_until(lambda: listener_pids(admin), 5, "the LISTEN backend")
    listener.close()
    assert listener._thread is not None and not listener._thread.is_alive()
    wait_until(lambda: not listener_pids(admin), 5, "the LISTEN backend to go away")


def test_listener_of_a_wakeup_nobody_closed_ends_when_the_wakeup_is_garbage(engines) -> None:
    import gc

    admin = engines()
    listener = PgWakeup(engines())
    listener.start()
    assert listener.listening.wait(10)
    thread = listener._thread
    del listener
    gc.collect()
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()
    wait_until(lambda: not listener_pids(admin), 5, "the LISTEN backend to go away")


# -- across processes ------------------------------------------------------------------------


@pytest.fixture
def pg_coordinator(pg_url: str, root: Path) -> Iterator[Coordinator]:
    registry = default_registry()
    pg_jobtypes.register(registry)
    c = Coordinator.open(pg_url, root=root, registry=registry)
    c.queue.wakeup = wakeup_for(c.engine)  # a no-op once Coordinator picks it itself
    yield c
    c.queue.wakeup.close()
    c.close()


def start_worker(pg_url: str, root: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.pg_jobtypes", "--db", pg_url, "--root", str(root), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def drain_time(c: Coordinator, timeout: float) -> float:
    """Enqueue one no-op job; seconds until it is completed."""
    t0 = time.monotonic()
    job_id = c.enqueue(pg_jobtypes.PgNoop()).id
    wait_until(lambda: c.get(job_id).status is JobStatus.COMPLETED, timeout, f"job {job_id}", interval=0.005)
    return time.monotonic() - t0


@pytest.mark.slow
def test_worker_in_another_process_picks_up_a_job_in_well_under_its_30s_poll(pg_url, root, pg_coordinator) -> None:
    proc = start_worker(pg_url, root, "--poll-interval", "30")
    try:
        drain_time(pg_coordinator, 60)  # the worker is up (its first claim needs no wake-up)
        wait_until(lambda: listener_pids(pg_coordinator.engine), 10, "the worker to LISTEN")
        times = [drain_time(pg_coordinator, 10) for _ in range(5)]
        print(f"pick-up to completion over LISTEN/NOTIFY: {[round(t, 3) for t in times]} s")
        assert max(times) < 1.0, times
    finally:
        stop(proc)
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""


@pytest.mark.slow
def test_worker_that_gets_no_notifications_still_picks_up_jobs_at_its_poll_interval(
    pg_url, root, pg_coordinator
) -> None:
    poll = 2.0
    proc = start_worker(pg_url, root, "--poll-interval", str(poll), "--no-listen")
    try:
        drain_time(pg_coordinator, 60)
        assert listener_pids(pg_coordinator.engine) == []  # nothing can deliver a notification
        times = [drain_time(pg_coordinator, poll + 5) for _ in range(3)]
        print(f"pick-up to completion by polling every {poll}s: {[round(t, 3) for t in times]} s")
        # Each job is enqueued just as the worker starts a poll's wait (it has just completed the
        # previous one), so each pick-up takes a whole interval (2.005 s here when quiet). Under a
        # loaded machine the rest took a second once: the bound is the next poll, which a worker
        # that did not poll at its interval would miss.
        assert max(times) < 2 * poll, times
    finally:
        stop(proc)
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
