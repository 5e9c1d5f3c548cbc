"""The worker loop: threads, wake-ups, database-error backoff, and SQLite set-up."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
import sqlalchemy as sa

from jobkit import Note, NoteType, registry_with
from tether import Coordinator, JobStatus, SystemClock
from tether.worker.loop import Worker


def test_threads_drain_every_job_exactly_once(make_coordinator):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue_many([Note(name=str(i)) for i in range(200)])
    assert c.run_until_idle(threads=4) == 200
    assert sorted(notes.seen) == sorted(str(i) for i in range(200))
    assert set(notes.seen.values()) == {1}


def _waiting(c: Coordinator, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once a worker of ``c`` has found nothing to claim and waits for a wake-up."""
    waiting = threading.Event()
    wait = c.queue.wakeup.wait

    def waits(seen: int, timeout: float) -> bool:
        waiting.set()
        return wait(seen, timeout)

    monkeypatch.setattr(c.queue.wakeup, "wait", waits)
    return waiting


def test_an_enqueue_in_the_same_process_wakes_an_idle_worker_at_once(make_coordinator, monkeypatch):
    notes = NoteType()
    c = make_coordinator(registry_with(notes), clock=SystemClock())
    w = c.worker(poll_interval=30)
    waiting = _waiting(c, monkeypatch)
    runner = threading.Thread(target=w.run, kwargs={"install_signals": False})
    runner.start()
    try:
        assert waiting.wait(10)  # the worker has looked once and gone idle
        started = time.monotonic()
        job_id = c.enqueue(Note(name="now")).id
        while c.get(job_id).status is not JobStatus.COMPLETED:
            assert time.monotonic() - started < 5, "worker did not wake up"
        assert time.monotonic() - started < 5  # far below the 30 s poll
    finally:
        w.stop()
        runner.join(10)
    assert not runner.is_alive()


def test_database_errors_back_off_exponentially_up_to_the_cap(coordinator, monkeypatch):
    w = coordinator.worker(poll_interval=1, max_db_backoff=30)
    seq = []
    b = 0.0
    for _ in range(7):
        b = w.supervisor.next_backoff(b)
        seq.append(b)
    assert seq == [1, 2, 4, 8, 16, 30, 30]


def test_the_loop_survives_database_errors_and_recovers(make_coordinator, monkeypatch):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    c.enqueue(Note(name="a"))
    real_claim = c.queue.claim
    failures = {"left": 2}

    def flaky_claim(*args, **kwargs):
        if failures["left"]:
            failures["left"] -= 1
            raise sa.exc.OperationalError("claim", {}, Exception("database is locked"))
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(c.queue, "claim", flaky_claim)
    w = c.worker(poll_interval=0.01, max_db_backoff=0.02)
    w.run_until_idle()
    assert failures["left"] == 0 and notes.seen == {"a": 1}


def test_an_outcome_is_recorded_once_the_database_returns(make_coordinator, monkeypatch):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    job_id = c.enqueue(Note(name="a")).id
    real = c.queue.finish_and_claim
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise sa.exc.OperationalError("finish", {}, Exception("disk I/O error"))
        return real(*args, **kwargs)

    monkeypatch.setattr(c.queue, "finish_and_claim", flaky)
    w = c.worker(poll_interval=0.01)
    assert w.run_once() == 1
    assert calls["n"] == 2 and notes.seen == {"a": 1}
    assert c.get(job_id).status is JobStatus.COMPLETED


def test_sqlite_connections_use_wal_full_sync_and_a_busy_timeout(tmp_path):
    with Coordinator.open(f"sqlite:///{tmp_path / 'a.db'}", root=tmp_path) as c:
        with c.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    with Coordinator.open(f"sqlite:///{tmp_path / 'b.db'}", root=tmp_path, durability="normal") as c:
        with c.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL


def test_sqlite_write_transactions_begin_immediate(tmp_path):
    with Coordinator.open(f"sqlite:///{tmp_path / 'a.db'}", root=tmp_path) as c:
        statements: list[str] = []
        c.engine.dispose()
        sa.event.listen(c.engine, "connect", lambda dbapi, _rec: dbapi.set_trace_callback(statements.append))
        c.queue.claim("w")  # the hot path, on the driver connection
        with c.engine.begin() as conn:  # SQLAlchemy writes
            conn.execute(sa.text("SELECT 1"))
        with c.engine.connect().execution_options(tether_read_only=True) as conn:
            conn.execute(sa.text("SELECT 1"))
    begins = [s for s in statements if s.startswith("BEGIN")]
    assert begins == ["BEGIN IMMEDIATE", "BEGIN IMMEDIATE", "BEGIN"]


def test_a_worker_id_names_host_and_process(coordinator):
    import os
    import socket

    w = coordinator.worker()
    host, pid, _ = w.id.split(":")
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    assert isinstance(w, Worker)


@pytest.mark.parametrize("watch", ["inotify", "stat"])
def test_an_idle_worker_wakes_when_another_process_commits(tmp_path, monkeypatch, watch):
    import subprocess
    import sys

    import tether.ledger.walwatch

    if watch == "stat":  # the fallback where the kernel has no inotify
        monkeypatch.setattr(tether.ledger.walwatch, "_inotify_fd", lambda directory: None)

    notes = NoteType()
    db = tmp_path / "l.db"
    with Coordinator.open(f"sqlite:///{db}", root=tmp_path / "data", registry=registry_with(notes)) as c:
        w = c.worker(poll_interval=60)
        waiting = _waiting(c, monkeypatch)
        runner = threading.Thread(target=w.run, kwargs={"install_signals": False})
        runner.start()
        try:
            assert waiting.wait(10)  # the worker has looked once and now waits
            # Another process enqueues; this process's in-memory wake-up knows nothing of it.
            code = (
                "import sys; sys.path.insert(0, 'tests');"
                "from tether import Coordinator; from jobkit import Note, NoteType, registry_with;"
                f"c = Coordinator.open('sqlite:///{db}', root='{tmp_path / 'data'}',"
                " registry=registry_with(NoteType()));"
                "print(c.enqueue(Note(name='remote')).id)"
            )
            job_id = subprocess.run(
                [sys.executable, "-c", code],
                check=True,
                capture_output=True,
                text=True,
                cwd=str(__import__("pathlib").Path(__file__).parent.parent),
            ).stdout.strip()
            started = time.monotonic()
            while c.get(job_id).status is not JobStatus.COMPLETED:  # the poll interval is 60 s
                assert time.monotonic() - started < 10, "the WAL watch did not wake the worker"
                time.sleep(0.005)
        finally:
            w.stop()
            runner.join(10)
    assert notes.seen == {"remote": 1}


def test_a_worker_claims_only_the_types_it_has_and_status_names_the_one_nobody_takes(make_coordinator, clock):
    from tether.observe import health, verdict

    notes = NoteType()
    full = make_coordinator(registry_with(notes))
    job = full.enqueue(Note(name="a")).id
    bare = make_coordinator()  # a worker started without --import: no "note" type
    assert bare.worker().run_until_idle() == 0
    assert full.get(job).status is JobStatus.PENDING and full.get(job).attempts == 0  # untouched
    clock.advance(301)
    checks = {c.name: c for c in health.health(bare).checks}
    assert checks["unclaimed:note"].verdict is verdict.Verdict.WARNING
    assert "is a worker with this type registered" in checks["unclaimed:note"].rule
    assert full.worker().run_until_idle() == 1 and full.get(job).status is JobStatus.COMPLETED
    assert not [c for c in health.health(full).checks if c.name.startswith("unclaimed:")]


def test_a_heartbeat_that_renews_after_an_outcome_was_recorded_reports_no_lost_lease(make_coordinator, caplog):
    """The heartbeat reads the running jobs, the group commit records one of them, then the
    heartbeat's renewal misses it: that job finished, it was not taken, so no ``lost_lease``.
    A job another worker took while it ran is still reported and cancelled."""
    from jobkit import completed

    c = make_coordinator(registry_with(NoteType()))
    c.enqueue_many([Note(name="finished"), Note(name="taken")])
    w = c.worker()
    finished, taken = c.queue.claim(w.id, limit=2)
    contexts = w.executor.start([finished, taken])
    w._record([completed(finished, None)])  # recorded; the batch is not over, so still "running"
    with c.engine.begin() as conn:  # another worker's sweep took the other one
        conn.execute(sa.text("UPDATE tether_jobs SET locked_by = 'other' WHERE id = :id"), {"id": taken.id})
    caplog.set_level("INFO", logger="tether.events")
    assert w.heartbeat_once() == [taken.id]
    lost = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tether.events"]
    assert [e["job_id"] for e in lost if e["event"] == "lost_lease"] == [taken.id]
    assert contexts[1].cancelled.is_set() and not contexts[0].cancelled.is_set()
    assert c.get(finished.id).status is JobStatus.COMPLETED
