"""The ledger's clock: on PostgreSQL the database's (``DatabaseClock``), kept between reads by an
elapsed-time counter; read afresh by every sweep and heartbeat; the machine's clock only reported.
On SQLite, and with a test's own clock, the clock given. (Real worker processes with wrong
machine clocks: tests/test_clock_skew.py.)"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import tether.clock
from conftest import drop_ledger
from jobkit import Note, NoteType, registry_with
from tether import Coordinator, FakeClock
from tether.clock import DatabaseClock, SystemClock
from tether.ledger.status import JobStatus
from tether.observe import schedules

SKEW = timedelta(minutes=10)
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Counter:
    """Stands in for the elapsed-time counter: seconds the test sets."""

    def __init__(self) -> None:
        self.seconds = 1000.0

    def __call__(self) -> float:
        return self.seconds


@pytest.fixture
def elapsed(monkeypatch: pytest.MonkeyPatch) -> Counter:
    counter = Counter()
    monkeypatch.setattr(tether.clock, "elapsed", counter)
    return counter


class ShiftedClock(SystemClock):
    """The clock of a machine ``shift`` off."""

    def __init__(self, shift: timedelta) -> None:
        self.shift = shift

    def now(self) -> datetime:
        return datetime.now(UTC) + self.shift


def skew_events(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [
        json.loads(r.getMessage())["machine_ahead_s"]
        for r in caplog.records
        if r.name == "tether.events" and '"clock_skew"' in r.getMessage()
    ]


# -- the clock itself ---------------------------------------------------------------------------


def test_database_clock_goes_on_from_its_last_reading_by_elapsed_time_not_by_the_machine_clock(
    elapsed: Counter,
) -> None:
    machine = FakeClock(T0 + SKEW)
    clock = DatabaseClock(machine)
    assert clock.sync(lambda: T0) == T0
    assert clock.now() == T0
    elapsed.seconds += 2.5
    assert clock.now() == T0 + timedelta(seconds=2.5)
    machine.advance(hours=-3)  # the machine's clock is set back (by hand, or by a broken NTP)
    assert clock.now() == T0 + timedelta(seconds=2.5)
    assert clock.now().tzinfo is UTC  # as SystemClock's: the backends' fast path for times


def test_a_reading_counts_from_the_middle_of_its_round_trip(elapsed: Counter) -> None:
    clock = DatabaseClock(FakeClock(T0))

    def slow_read() -> datetime:
        elapsed.seconds += 0.4  # the query took 0.4 s there and back
        return T0

    clock.sync(slow_read)
    assert clock.now() == T0 + timedelta(seconds=0.2)


def test_clock_skew_is_reported_when_first_found_and_when_it_changes(
    elapsed: Counter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tether.events")
    machine = FakeClock(T0 + SKEW)
    clock = DatabaseClock(machine)
    clock.sync(lambda: T0)
    assert skew_events(caplog) == [600.0] and clock.machine_ahead == 600.0
    elapsed.seconds += 30
    machine.advance(30.2)
    clock.sync(lambda: T0 + timedelta(seconds=30))  # the same error, give or take: said once
    assert skew_events(caplog) == [600.0]
    machine.set(T0 + timedelta(seconds=60))
    elapsed.seconds += 30
    clock.sync(lambda: T0 + timedelta(seconds=60))  # NTP put it right
    assert skew_events(caplog) == [600.0, 0.0]


def test_a_right_machine_clock_reports_no_skew(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tether.events")
    DatabaseClock(SystemClock()).sync(lambda: datetime.now(UTC))
    assert skew_events(caplog) == []


# -- which clock a ledger gets --------------------------------------------------------------------


@pytest.fixture
def pg_ledger(pg_database: str) -> Iterator[str]:
    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        drop_ledger(conn)
    yield pg_database
    engine.dispose()


def db_now(c: Coordinator) -> datetime:
    with c.engine.connect() as conn:
        return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()


def test_on_postgresql_the_machine_clock_gives_way_to_the_database_clock(pg_ledger: str, root: Path) -> None:
    with Coordinator.open(pg_ledger, root=root) as c:
        assert isinstance(c.clock, DatabaseClock) and c.clock.synced
        assert type(c.clock.machine) is SystemClock
    fast = ShiftedClock(SKEW)
    with Coordinator.open(pg_ledger, root=root, clock=fast) as c:
        assert isinstance(c.clock, DatabaseClock) and c.clock.machine is fast
        assert abs((c.clock.now() - db_now(c)).total_seconds()) < 1
        assert abs(c.clock.machine_ahead - SKEW.total_seconds()) < 1


def test_a_test_clock_is_used_as_given_on_either_backend(db_url: str, root: Path) -> None:
    fake = FakeClock(T0)
    with Coordinator.open(db_url, root=root, registry=registry_with(NoteType()), clock=fake) as c:
        assert c.clock is fake
        assert c.enqueue(Note(name="n")).job.created_at == T0


def test_on_sqlite_every_process_reads_the_machine_clock(tmp_path: Path, root: Path) -> None:
    with Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=root) as c:
        assert type(c.clock) is SystemClock


def test_a_delay_on_a_fast_machine_counts_from_the_database_time(pg_ledger: str, root: Path) -> None:
    with Coordinator.open(pg_ledger, root=root, registry=registry_with(NoteType()), clock=ShiftedClock(SKEW)) as c:
        job = c.enqueue(Note(name="later"), delay=5).job
        assert abs((job.run_at - db_now(c)).total_seconds() - 5) < 1
        assert abs((job.created_at - db_now(c)).total_seconds()) < 1


# -- sweeps and heartbeats read the database's time --------------------------------------------


@pytest.fixture
def pg_coordinator(pg_ledger: str, root: Path) -> Iterator[Coordinator]:
    with Coordinator.open(pg_ledger, root=root, registry=registry_with(NoteType()), lock_timeout=30) as c:
        yield c


def knock_off(c: Coordinator, by: timedelta) -> None:
    """Set the coordinator's DatabaseClock ``by`` off the database (as a clock carried too long
    on a counter that ran fast or slow would be)."""
    assert isinstance(c.clock, DatabaseClock)
    c.clock.sync(lambda: db_now(c) + by)
    assert abs((c.clock.now() - db_now(c) - by).total_seconds()) < 1


def test_the_sweep_measures_lock_ages_by_the_database_time_it_reads(pg_coordinator: Coordinator) -> None:
    c = pg_coordinator
    c.enqueue(Note(name="running"))
    [job] = c.queue.claim("w1")
    knock_off(c, SKEW)
    assert c.reclaim_stale() == []  # by the clock's old reading its lock would be 10 minutes old
    assert c.get(job.id).status is JobStatus.CLAIMED
    assert abs((c.clock.now() - db_now(c)).total_seconds()) < 1  # and the clock goes on from the new one


def test_the_sweep_still_reclaims_a_lock_older_than_the_timeout_by_the_database_clock(
    pg_coordinator: Coordinator,
) -> None:
    c = pg_coordinator
    c.enqueue(Note(name="dead"), run_at=db_now(c) - timedelta(minutes=1))
    [job] = c.queue.claim("dead-worker", now=db_now(c) - timedelta(seconds=31))
    knock_off(c, -SKEW)
    assert [j.id for j in c.reclaim_stale()] == [job.id]


def test_a_heartbeat_writes_the_database_time_it_reads(pg_coordinator: Coordinator) -> None:
    c = pg_coordinator
    c.enqueue(Note(name="running"))
    [job] = c.queue.claim("w1")
    knock_off(c, -SKEW)
    assert c.queue.heartbeat("w1", [job]) == []
    locked_at = c.get(job.id).locked_at
    assert locked_at is not None and abs((locked_at - db_now(c)).total_seconds()) < 1


# -- schedules ----------------------------------------------------------------------------------


def test_resuming_a_schedule_from_a_fast_machine_keeps_the_next_slot_by_the_database_clock(
    pg_ledger: str, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Coordinator.open(pg_ledger, root=root, registry=registry_with(NoteType())) as c:
        c.schedule("every-minute", "* * * * *", Note(name="tick"))
        schedules.set_paused(c.engine, "every-minute", True)
        real = SystemClock.now
        monkeypatch.setattr(SystemClock, "now", staticmethod(lambda: real() + SKEW))  # this machine's clock
        result = schedules.set_paused(c.engine, "every-minute", False)
        assert 0 < (result["next_run"] - db_now(c)).total_seconds() <= 60


# -- an operator's machine ----------------------------------------------------------------------


def test_stuck_on_a_fast_operator_machine_judges_lock_ages_by_the_database_clock(
    pg_coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tether.observe import stuck
    from tether.observe.readonly import open_ledger

    c = pg_coordinator
    c.enqueue(Note(name="running"))
    c.queue.claim("w1")
    real = SystemClock.now
    monkeypatch.setattr(SystemClock, "now", staticmethod(lambda: real() + SKEW))  # this machine's clock
    engine = open_ledger(c.engine.url.render_as_string(hide_password=False))  # as `tether stuck` reads it
    try:
        before = db_now(c)
        found = stuck.stuck(engine, lock_timeout=30)
        after = db_now(c)
    finally:
        engine.dispose()
    assert found.jobs == []
    # Read between two readings of the database's clock, however slow the machine: the skewed
    # machine clock is minutes outside them.
    assert before <= found.now <= after
