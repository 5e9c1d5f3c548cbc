"""PostgreSQL connections that die under tether: one event line and no traceback per drop, no
job lost; a commit whose answer was lost is told apart from one that never happened, for an
enqueue (CommitUnknown) and for a worker's group commit (read back, never recorded twice)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import sqlalchemy as sa

from conftest import scratch_pg_database
from jobkit import Note, NoteType, registry_with
from tether import Cancelled, CommitUnknown, Coordinator, CreateFile, DatabaseUnavailable, JobContext, JobType
from tether.ledger.postgresql import PostgresBackend
from tether.ledger.status import JobStatus

ENQUEUER = Path(__file__).with_name("proc_enqueuer.py")
# Every client connection to the test's database but the killer's own.
KILL_ALL = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
)
# A trigger that terminates its own connection the first time it fires (a sequence, which a
# rollback does not undo, counts the firings). Deferred, it fires inside COMMIT.
KILL_ONCE = """
CREATE SEQUENCE kill_once;
CREATE FUNCTION kill_self() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('kill_once') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
    RETURN NULL;
END $$;
"""


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[tuple[str, sa.Engine]]:
    """A scratch database holding a ledger, and an autocommit engine on it for the test's own SQL."""
    with scratch_pg_database("tether_lost") as url:
        Coordinator.open(url, root=tmp_path / "data").close()  # the ledger's tables
        admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            yield url, admin
        finally:
            admin.dispose()


def run_sql(admin: sa.Engine, statement: str) -> Any:
    with admin.connect() as conn:
        result = conn.exec_driver_sql(statement)
        return result.scalar() if result.returns_rows else None


def kill_once_at(admin: sa.Engine, event: str, *, at_commit: bool, when: str = "true") -> None:
    """The first row ``event`` (INSERT, UPDATE) changes where ``when`` holds terminates its own
    connection: at the end of its statement, or ``at_commit``, inside COMMIT."""
    timing = "DEFERRABLE INITIALLY DEFERRED" if at_commit else "NOT DEFERRABLE"
    run_sql(admin, KILL_ONCE)
    run_sql(
        admin,
        f"CREATE CONSTRAINT TRIGGER kill_once AFTER {event} ON tether_jobs {timing} FOR EACH ROW "
        f"WHEN ({when}) EXECUTE FUNCTION kill_self()",
    )


class LoseTheAnswer:
    """While armed, a PostgreSQL commit lands, then its connection dies before the client reads
    the answer: the backend is terminated and the driver meets the dead socket, as after a
    network cut. ``then`` runs between the two (once the commit has landed). Armed for every
    commit, or with ``arm_in`` only inside that method of the queue."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, admin: sa.Engine, queue=None, arm_in: str = "") -> None:
        self.armed = not arm_in
        self.lost = 0
        self.then = lambda: None
        real = PostgresBackend._commit

        def commit(backend: PostgresBackend, driver, cur) -> None:
            real(backend, driver, cur)
            if not self.armed:
                return
            self.armed = False  # once
            self.lost += 1
            self.then()
            run_sql(admin, f"SELECT pg_terminate_backend({driver.info.backend_pid}, 5000)")
            driver.execute("SELECT 1")  # raises: the server has gone

        monkeypatch.setattr(PostgresBackend, "_commit", commit)
        if arm_in:
            method = getattr(queue, arm_in)

            def armed(*args, **kwargs):
                self.armed = self.lost == 0
                return method(*args, **kwargs)

            monkeypatch.setattr(queue, arm_in, armed)


def events_named(caplog: pytest.LogCaptureFixture, name: str) -> list[dict]:
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "tether.events"]
    return [e for e in lines if e["event"] == name]


# -- connections killed under a running application ----------------------------------------------


def test_connections_killed_under_an_enqueuing_process_cost_one_event_line_each_and_lose_no_job(pg, tmp_path):
    url, admin = pg
    child = subprocess.Popen(
        [sys.executable, str(ENQUEUER), url, str(tmp_path / "data")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin and child.stdout and child.stderr
    stdin, stdout, stderr_pipe = child.stdin, child.stdout, child.stderr
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True)
    reader.start()
    killed = 0
    oks = lambda: sum(line.startswith("ok ") for line in list(lines))  # noqa: E731
    deadline = time.monotonic() + 30

    def until_an_enqueue_returns(seen: int) -> None:
        while oks() <= seen:
            assert time.monotonic() < deadline, "the enqueuer stopped making progress"
            assert child.poll() is None, stderr_pipe.read()
            time.sleep(0.002)

    try:
        until_an_enqueue_returns(0)  # opened: from here on, kills meet enqueues only
        for _ in range(40):
            # Kill, then wait for an enqueue to return before the next kill: every kill meets a
            # process that is enqueueing, mostly in the middle of a transaction.
            seen = oks()
            killed += run_sql(admin, KILL_ALL)
            until_an_enqueue_returns(seen)
    finally:
        stdin.close()
        child.wait(timeout=30)
        reader.join(timeout=10)
    stderr = stderr_pipe.read()
    assert child.returncode == 0, stderr
    assert "Traceback" not in stderr and "Exception during reset" not in stderr
    printed = [orjson.loads(line) for line in stderr.splitlines()]  # only event lines, each JSON
    drops = [e for e in printed if e["event"] == "connection_lost"]
    assert 0 < len(drops) <= killed
    outcomes: dict[str, list[str]] = {"ok": [], "refused": [], "unknown": []}
    for line in lines:
        kind, *values = line.split()
        outcomes[kind] += values
    assert outcomes["refused"] or outcomes["unknown"], "no kill met an enqueue: the test proved nothing"
    with admin.connect() as conn:
        stored = set(conn.exec_driver_sql("SELECT id FROM tether_jobs").scalars())
        targets = set(conn.exec_driver_sql("SELECT ordering_key FROM tether_jobs").scalars())
    assert set(outcomes["ok"]) <= stored  # none lost whose enqueue returned
    assert not {f"file:{path}" for path in outcomes["refused"]} & targets  # "nothing was enqueued" holds


# -- an enqueue's commit ----------------------------------------------------------------------------


def test_an_enqueue_killed_during_its_commit_is_reported_as_unknown_not_as_nothing_enqueued(pg, tmp_path):
    url, admin = pg
    kill_once_at(admin, "INSERT", at_commit=True)
    with Coordinator.open(url, root=tmp_path / "data") as c:
        with pytest.raises(CommitUnknown, match="may or may not have been recorded") as raised:
            c.enqueue(CreateFile(path="a.json", content={}), key="a")
        assert not isinstance(raised.value, DatabaseUnavailable)  # a retry loop for that one must not catch it
        assert "idempotency key" in str(raised.value) and raised.value.job_ids[0] in str(raised.value)
        assert run_sql(admin, "SELECT count(*) FROM tether_jobs") == 0  # this time it had not landed
        assert not c.enqueue(CreateFile(path="a.json", content={}), key="a").duplicate


def test_an_enqueue_whose_commit_landed_before_its_answer_was_lost_is_unknown_and_a_keyed_retry_finds_it(
    pg, tmp_path, monkeypatch
):
    url, admin = pg
    with Coordinator.open(url, root=tmp_path / "data") as c:
        fault = LoseTheAnswer(monkeypatch, admin)
        with pytest.raises(CommitUnknown) as raised:
            c.enqueue(CreateFile(path="a.json", content={}), key="a")
        assert fault.lost == 1
        [job_id] = raised.value.job_ids
        assert c.get(job_id).status is JobStatus.PENDING  # it had landed
        retried = c.enqueue(CreateFile(path="a.json", content={}), key="a")
        assert retried.duplicate and retried.id == job_id  # the key made the retry safe
        assert run_sql(admin, "SELECT count(*) FROM tether_jobs") == 1


def test_an_enqueue_whose_commit_landed_and_whose_pipeline_then_broke_is_unknown_not_nothing_enqueued(
    pg, tmp_path, monkeypatch
):
    """The driver can raise before it has read the connection's end ("cannot exit pipeline mode
    while busy", the connection not yet marked closed): the COMMIT was sent, so whether it landed
    is unknown all the same, and that connection is not used again."""
    url, _admin = pg
    real = PostgresBackend._commit
    broken: list[Any] = []

    def commit(backend: PostgresBackend, driver: Any, cur: Any) -> None:
        real(backend, driver, cur)
        if not broken:
            broken.append(driver)
            raise psycopg.OperationalError("cannot exit pipeline mode while busy")

    monkeypatch.setattr(PostgresBackend, "_commit", commit)
    with Coordinator.open(url, root=tmp_path / "data") as c:
        with pytest.raises(CommitUnknown) as raised:
            c.enqueue(CreateFile(path="a.json", content={}))
        assert not isinstance(raised.value, DatabaseUnavailable)
        [job_id] = raised.value.job_ids
        assert c.get(job_id).status is JobStatus.PENDING  # it had landed
        assert broken[0].closed
        assert c.enqueue(CreateFile(path="b.json", content={})).job.status is JobStatus.PENDING


def test_an_enqueue_whose_connection_died_before_its_commit_says_nothing_was_enqueued(pg, tmp_path, caplog):
    url, admin = pg
    kill_once_at(admin, "INSERT", at_commit=False)  # during the INSERT, before any COMMIT
    caplog.set_level(logging.INFO, logger="tether.events")
    with Coordinator.open(url, root=tmp_path / "data") as c:
        with pytest.raises(DatabaseUnavailable, match="nothing was enqueued"):
            c.enqueue(CreateFile(path="a.json", content={}), key="a")
        assert run_sql(admin, "SELECT count(*) FROM tether_jobs") == 0
        assert [e.get("during") for e in events_named(caplog, "connection_lost")] == [None]
        assert c.enqueue(CreateFile(path="a.json", content={}), key="a").job.status is JobStatus.PENDING


# -- a worker's group commit ----------------------------------------------------------------------


def test_a_worker_whose_group_commit_landed_unseen_reads_it_back_and_records_nothing_twice(
    pg, tmp_path, monkeypatch, caplog
):
    url, admin = pg
    notes = NoteType()
    caplog.set_level(logging.INFO, logger="tether.events")
    with Coordinator.open(url, root=tmp_path / "data", registry=registry_with(notes)) as c:
        ids = [r.id for r in c.enqueue_many([Note(name=f"n{i}") for i in range(3)])]
        fault = LoseTheAnswer(monkeypatch, admin, c.queue, arm_in="finish_and_claim")
        assert c.worker(poll_interval=0.01, max_db_backoff=0.05).run_once() == 3
        assert fault.lost == 1
        assert dict(notes.seen) == {"n0": 1, "n1": 1, "n2": 1}
        assert all(c.get(i).status is JobStatus.COMPLETED and c.get(i).attempts == 1 for i in ids)
        assert [e["landed"] for e in events_named(caplog, "commit_rechecked")] == [True]
        assert sorted(e["job_id"] for e in events_named(caplog, "completed")) == sorted(ids)
        assert events_named(caplog, "lost_lease") == []  # recorded once, not refused by its own fence
        assert len(events_named(caplog, "connection_lost")) == 1 and events_named(caplog, "db_error") == []


class Yield(JobType[Note]):
    """Gives its first attempt back (as a shutdown does); later attempts return."""

    name = "note"
    payload_model = Note

    def __init__(self) -> None:
        self.runs = 0

    def run(self, payload: Note, ctx: JobContext) -> None:
        self.runs += 1
        if self.runs == 1:
            raise Cancelled("shutting down")


def test_a_lost_commit_that_released_a_job_never_gives_back_the_claim_this_worker_took_since(
    pg, tmp_path, monkeypatch, clock
):
    url, admin = pg
    with Coordinator.open(url, root=tmp_path / "data", registry=registry_with(Yield()), clock=clock) as c:
        job_id = c.enqueue(Note(name="a")).id
        worker = c.worker(poll_interval=0.01, max_db_backoff=0.05)
        fault = LoseTheAnswer(monkeypatch, admin, c.queue, arm_in="finish_and_claim")
        again = []

        def claim_again() -> None:
            # The release has landed; before its answer arrives, another of this worker's threads
            # claims the job anew: the same worker id and attempt number, a later claim time.
            clock.advance(1)
            again.extend(c.queue.claim(worker.id, limit=1))

        fault.then = claim_again
        assert worker.run_once() == 1
        assert fault.lost == 1 and [j.id for j in again] == [job_id] and again[0].attempts == 1
        now = c.get(job_id)
        assert (now.status, now.locked_by, now.attempts) == (JobStatus.CLAIMED, worker.id, 1)
        assert now.claimed_at == again[0].claimed_at  # the new claim stands: not given back


def test_a_worker_whose_group_commit_was_killed_before_landing_records_it_again(pg, tmp_path, caplog):
    url, admin = pg
    notes = NoteType()
    caplog.set_level(logging.INFO, logger="tether.events")
    with Coordinator.open(url, root=tmp_path / "data", registry=registry_with(notes)) as c:
        ids = [r.id for r in c.enqueue_many([Note(name=f"n{i}") for i in range(3)])]
        kill_once_at(admin, "UPDATE", at_commit=True, when="NEW.status = 'completed'")
        assert c.worker(poll_interval=0.01, max_db_backoff=0.05).run_once() == 3
        assert run_sql(admin, "SELECT last_value FROM kill_once") > 1  # it fired, and again on the second try
        assert dict(notes.seen) == {"n0": 1, "n1": 1, "n2": 1}  # nothing ran twice
        assert all(c.get(i).status is JobStatus.COMPLETED for i in ids)  # nothing lost
        assert [e["landed"] for e in events_named(caplog, "commit_rechecked")] == [False]
        assert [e["during"] for e in events_named(caplog, "connection_lost")] == ["commit"]


def test_a_worker_whose_connection_is_killed_while_claiming_logs_one_line_for_it_and_goes_on(pg, tmp_path, caplog):
    url, admin = pg
    notes = NoteType()
    caplog.set_level(logging.INFO, logger="tether.events")
    with Coordinator.open(url, root=tmp_path / "data", registry=registry_with(notes)) as c:
        c.enqueue_many([Note(name=f"n{i}") for i in range(3)])
        kill_once_at(admin, "UPDATE", at_commit=False, when="NEW.status = 'claimed'")
        assert c.worker(poll_interval=0.01, max_db_backoff=0.05).run_until_idle(install_signals=False) == 3
        assert dict(notes.seen) == {"n0": 1, "n1": 1, "n2": 1}
        # The claim's COMMIT goes in its round trip: the loss is met with it in flight.
        assert [e.get("during") for e in events_named(caplog, "connection_lost")] == ["commit"]
        assert events_named(caplog, "db_error") == []  # the drop's one line is connection_lost
