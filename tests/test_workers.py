"""The register of worker processes (``tether_workers``): a worker writes its row when it
starts, its heartbeat renews it, it marks itself stopped; one silent for the lock timeout is
gone. Read by ``tether workers`` and the web page's workers view. On each backend."""

from __future__ import annotations

import json
import os
import socket
import threading

import sqlalchemy as sa

from jobkit import Block, BlockType, Note, NoteType, registry_with
from tether.ledger import workers as register
from tether.ledger.engine import ensure_schema
from tether.observe.workers import GONE, RUNNING, STOPPED, workers
from tether.version import installed
from workerkit import wait_for


def test_a_worker_registers_itself_and_marks_itself_stopped(make_coordinator, clock):
    c = make_coordinator(registry_with(NoteType()))
    c.enqueue(Note(name="a"))
    assert workers(c) == []
    c.run_until_idle()
    [w] = workers(c)
    assert (w.state, w.host, w.pid, w.threads, w.version) == (
        STOPPED,
        socket.gethostname(),
        os.getpid(),
        1,
        installed(),
    )
    assert w.started_at == w.beat_at == w.stopped_at == clock.now() and w.jobs == []


def test_a_running_worker_shows_the_jobs_it_runs_with_their_progress_and_its_heartbeat(make_coordinator, clock):
    blocker = BlockType()
    c = make_coordinator(registry_with(blocker))
    job = c.enqueue(Block(name="long")).id
    worker = c.worker(threads=2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        assert blocker.started.wait(30), "the job never started"
        held = c.get(job)
        assert c.queue.record_progress(held, worker.id, '{"done": 3, "total": 4, "note": "copying"}')
        [w] = workers(c)
        assert (w.id, w.state, w.threads, [j.id for j in w.jobs]) == (worker.id, RUNNING, 2, [job])
        assert w.jobs[0].progress is not None and json.loads(w.jobs[0].progress)["done"] == 3
        clock.advance(60)
        worker.heartbeat_once()
        assert workers(c)[0].beat_at == clock.now()
    finally:
        blocker.release.set()
        worker.stop()
        thread.join(30)
    assert workers(c)[0].state == STOPPED


def test_an_idle_worker_s_heartbeat_keeps_it_shown_as_running(make_coordinator, clock):
    c = make_coordinator(registry_with(NoteType()))
    worker = c.worker(threads=1)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        # Once the register shows it (its run's registration committed): a registration landing
        # after the clock moves would write the old time.
        wait_for(lambda: workers(c), "the worker's registration")
        clock.advance(c.lock_timeout + 1)  # without a beat since, it would be gone
        worker.heartbeat_once()
        [w] = workers(c)
        assert (w.state, w.beat_at, w.jobs) == (RUNNING, clock.now(), [])
    finally:
        worker.stop()
        thread.join(30)


def test_a_worker_whose_heartbeat_stopped_is_shown_as_gone(make_coordinator, clock):
    c = make_coordinator()
    register.register(c.queue, "dead-host:1:aaaaaa", 4)
    clock.advance(c.lock_timeout - 1)
    assert workers(c)[0].state == RUNNING
    clock.advance(2)
    register.register(c.queue, "live-host:2:bbbbbb", 1)
    states = {w.id: w.state for w in workers(c)}
    assert states == {"dead-host:1:aaaaaa": GONE, "live-host:2:bbbbbb": RUNNING}
    assert [w.state for w in workers(c)] == [RUNNING, GONE]  # the live ones first


def test_workers_not_heard_of_for_a_day_are_forgotten_when_another_starts(make_coordinator, clock):
    c = make_coordinator()
    register.register(c.queue, "old:1:aaaaaa", 1)
    clock.advance(register.FORGET_AFTER.total_seconds() + 1)
    register.register(c.queue, "new:2:bbbbbb", 1)
    assert [w.id for w in workers(c)] == ["new:2:bbbbbb"]


def test_an_older_ledger_gets_the_register_of_workers(make_coordinator, clock):
    c = make_coordinator(registry_with(NoteType()))
    with c.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE tether_workers")
    assert workers(c) == []  # read as empty, not an error
    ensure_schema(c.engine)
    assert sa.inspect(c.engine).has_table("tether_workers")
    c.enqueue(Note(name="a"))
    c.run_until_idle()
    assert [w.state for w in workers(c)] == [STOPPED]


def test_tether_workers_prints_each_worker_and_its_json(make_coordinator, clock, monkeypatch, capsys):
    from clikit import run_split

    c = make_coordinator(registry_with(NoteType()))
    c.enqueue(Note(name="a"))
    c.run_until_idle()
    url = c.engine.url.render_as_string(hide_password=False)
    code, out, _ = run_split(monkeypatch, capsys, "--db", url, "workers", "--json")
    assert code == 0
    [w] = json.loads(out)["workers"]
    assert (w["state"], w["pid"], w["threads"], w["jobs"]) == ("stopped", os.getpid(), 1, [])
    code, out, _ = run_split(monkeypatch, capsys, "--db", url, "workers")
    assert code == 0 and "stopped" in out and socket.gethostname()[:10] in out


def test_a_worker_whose_registration_failed_registers_on_its_next_heartbeat(make_coordinator, clock, monkeypatch):
    c = make_coordinator(registry_with(NoteType()))
    worker = c.worker(threads=1)
    real = register.register

    def refused(*_: object) -> None:
        raise sa.exc.OperationalError("INSERT", {}, Exception("database is locked"))

    monkeypatch.setattr(register, "register", refused)
    worker.supervisor.register()  # logged; the worker runs unlisted
    assert workers(c) == []
    monkeypatch.setattr(register, "register", real)
    worker.heartbeat_once()
    assert [(w.id, w.state) for w in workers(c)] == [(worker.id, RUNNING)]


# A commit's wait for the disk, as each database is asked for it (inside a transaction).
SYNC_LEVEL = {"sqlite": ("PRAGMA synchronous", 1, 2), "postgresql": ("SHOW synchronous_commit", "off", "on")}


def test_the_register_s_transactions_do_not_wait_for_the_disk_and_the_next_one_does(make_coordinator, monkeypatch):
    c = make_coordinator()
    backend = c.queue.backend
    ask, unsynced, synced = SYNC_LEVEL[backend.name]
    assert backend.transact_unsynced(lambda cur: cur.scalar(ask)) == unsynced
    assert backend.transact(lambda cur: cur.scalar(ask)) == synced  # the level is back for every other commit
    seen = []
    real = backend.transact_unsynced

    def noted(body, **kw):
        return real(lambda cur: (seen.append(cur.scalar(ask)), body(cur))[1], **kw)

    monkeypatch.setattr(backend, "transact_unsynced", noted)
    c.run_until_idle()
    assert seen == [unsynced, unsynced]  # the worker's start and its stop
    assert [w.state for w in workers(c)] == [STOPPED]


def test_a_worker_s_next_run_takes_over_its_last_run_s_connections(tmp_path):
    from tether import Coordinator

    opened = []
    with Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data") as c:
        sa.event.listen(c.engine, "connect", lambda *_: opened.append(1))
        worker = c.worker(threads=1)
        # The first run's claiming thread takes the pool's idle connection for its own; the
        # second run's reads open the pool another. From then on nothing is opened.
        worker.run_until_idle(install_signals=False)
        worker.run_until_idle(install_signals=False)
        first = len(opened)
        for _ in range(3):
            worker.run_until_idle(install_signals=False)
            c.worker(threads=1).run_until_idle(install_signals=False)  # a new worker, as a script makes
        assert len(opened) == first, "each run opened a connection of its own"
