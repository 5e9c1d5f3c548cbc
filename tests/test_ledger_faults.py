"""A ledger that is corrupt, full, read-only, emptied or gone stops a worker with one line and
exit status 74; what passes (a locked file, a dropped connection) is retried as before."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import orjson
import psycopg
import pytest
import sqlalchemy as sa

from conftest import scratch_pg_database
from jobkit import Note, NoteType, registry_with
from tether import Coordinator, CreateFile
from tether.errors import LedgerFault
from tether.ledger.faults import EXIT_LEDGER_FAULT
from tether.ledger.status import JobStatus
from tether.worker.loop import Worker


def cli(db: Path, root: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "TETHER_DB": f"sqlite:///{db}", "TETHER_ROOT": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "tether", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def last_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


def events(proc: subprocess.CompletedProcess, name: str) -> list[dict]:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("{")]
    return [e for e in map(orjson.loads, lines) if e["event"] == name]


def ledger_with_jobs(tmp_path: Path, n: int = 300) -> tuple[Path, Path]:
    """A SQLite ledger holding ``n`` pending create_file jobs (a few dozen pages), closed."""
    db, root = tmp_path / "ledger" / "tether.db", tmp_path / "data"
    with Coordinator.open(f"sqlite:///{db}", root=root) as c:
        c.enqueue_many([CreateFile(path=f"f{i}.json", content={"i": i, "pad": "x" * 200}) for i in range(n)])
    assert not Path(f"{db}-wal").exists()  # checkpointed: every page is in the file itself
    return db, root


def test_a_ledger_removed_while_a_connection_opens_is_a_database_error(tmp_path: Path, monkeypatch) -> None:
    # Between SQLite's open of the file and the look at its size, the file can go: that must
    # reach callers as the database error they handle, not as a FileNotFoundError that ends a
    # worker's thread with a traceback.
    db, root = ledger_with_jobs(tmp_path, n=1)
    with Coordinator.open(f"sqlite:///{db}", root=root) as c:
        c.engine.dispose()  # the next connection is a new one
        real_stat = Path.stat

        def removed(self: Path, *args, **kwargs):
            if self.name == db.name:
                raise FileNotFoundError(2, "No such file or directory", str(self))
            return real_stat(self, *args, **kwargs)

        monkeypatch.setattr(Path, "stat", removed)
        with pytest.raises(sa.exc.OperationalError, match="No such file or directory"):
            c.engine.connect()


def run_bounded(worker: Worker, seconds: float = 30) -> int:
    """``worker.run_until_idle()``, failing the test if it is still retrying after ``seconds``
    (a fault must stop it at once, not after a backoff that never ends)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(worker.run_until_idle(install_signals=False))
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        worker.stop(cancel=True)
        thread.join(30)
        pytest.fail(f"the worker was still retrying after {seconds} s")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]  # type: ignore[return-value]


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# -- corrupt -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "reason"),
    [(4096, "DatabaseError: database disk image is malformed"), (0, "DatabaseError: file is not a database")],
)
def test_a_corrupt_ledger_stops_the_worker_at_once_with_one_line_and_exit_74(tmp_path, offset, reason):
    db, root = ledger_with_jobs(tmp_path)
    # Past the header page, every page is damaged: which pages hold the jobs depends on the order the
    # ledger's tables were made in, and a worker must meet the damage whichever it reads.
    size = max(db.stat().st_size - offset, 16384) if offset else 16384
    overwrite(db, offset, (b"\xde\xad\xbe\xef" * (size // 4 + 1))[:size])
    started = time.monotonic()
    proc = cli(db, root, "worker", "--until-idle")
    assert proc.returncode == EXIT_LEDGER_FAULT == 74
    assert last_line(proc) == (
        f"tether: ledger fault: the ledger at {db} is corrupt ({reason}); stop every worker and restore the "
        "ledger from a backup (SQLite: sqlite3 FILE .recover)"
    )
    assert time.monotonic() - started < 30  # no backoff loop (it used to retry for ever)
    for event in events(proc, "ledger_fault"):
        assert event["fault"] == "corrupt" and reason in event["error"]
    assert not events(proc, "db_error")
    proc = cli(db, root, "enqueue", "create_file", "--payload", '{"path": "new.json", "text": "x"}')
    assert proc.returncode == 74 and last_line(proc).startswith(f"tether: ledger fault: the ledger at {db}")
    if offset == 0:  # every read fails (a damaged page deep in the file may be one reconcile never reads)
        proc = cli(db, root, "reconcile")  # could not check: 1, never 2 (drift), and it says why
        assert proc.returncode == 1 and "is corrupt (DatabaseError: file is not a database)" in last_line(proc)


# -- empty and missing ---------------------------------------------------------------------------


def test_a_zero_byte_ledger_is_refused_never_recreated_as_an_empty_one(tmp_path):
    db, root = ledger_with_jobs(tmp_path, n=3)
    db.write_bytes(b"")
    for args in (
        ["enqueue", "create_file", "--payload", '{"path": "a.json", "text": "x"}'],
        ["worker", "--until-idle"],
    ):
        proc = cli(db, root, *args)
        assert proc.returncode == 74, proc.stderr
        assert last_line(proc).startswith(f"tether: ledger fault: the ledger file {db} is empty (0 bytes)")
    assert db.stat().st_size == 0  # still the evidence, not a fresh ledger
    with pytest.raises(LedgerFault, match="is empty"):
        Coordinator.open(f"sqlite:///{db}", root=root)
    assert db.stat().st_size == 0


def test_a_new_ledger_is_never_seen_empty_at_its_path(tmp_path, monkeypatch):
    # Only a path with no file is a new ledger, so tether must never leave one empty there, not
    # even for the moment between SQLite creating the file and writing its header: another
    # process opening it then would refuse it. It is built aside and linked in whole.
    db = tmp_path / "new" / "tether.db"
    seen: list[int] = []
    real_create_engine = sa.create_engine  # what tether.ledger.engine calls

    def watched(url, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        engine = real_create_engine(url, *args, **kwargs)
        if engine.url.database == str(db):
            # First in line: what any connection at the ledger's path finds before touching it.
            sa.event.listen(engine, "connect", lambda *_: seen.append(db.stat().st_size), insert=True)
        return engine

    monkeypatch.setattr(sa, "create_engine", watched)
    openers = [
        threading.Thread(target=lambda: Coordinator.open(f"sqlite:///{db}", root=tmp_path).close()) for _ in range(4)
    ]
    for t in openers:
        t.start()
    for t in openers:
        t.join(60)
    monkeypatch.undo()
    assert seen and 0 not in seen, seen
    with Coordinator.open(f"sqlite:///{db}", root=tmp_path) as c:  # one ledger, usable
        c.enqueue(CreateFile(path="a.json", text="x"))
    assert [p.name for p in db.parent.iterdir() if "tether-new" in p.name] == []


def test_a_ledger_deleted_or_emptied_under_a_running_worker_stops_it(tmp_path):
    for damage in ("delete", "truncate"):
        db, root = ledger_with_jobs(tmp_path / damage, n=1)
        env = {**os.environ, "TETHER_DB": f"sqlite:///{db}", "TETHER_ROOT": str(root)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "tether", "worker", "--poll-interval", "0.05"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not (root / "f0.json").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert (root / "f0.json").exists()
            if damage == "delete":
                db.unlink()
            else:
                os.truncate(db, 0)
            code = proc.wait(timeout=30)
        finally:
            proc.kill()
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert code == 74 and "Traceback" not in stderr, stderr
        line = stderr.strip().splitlines()[-1]
        assert line.startswith(f"tether: ledger fault: the ledger at {db} is "), line
        expected = "gone (the file was deleted" if damage == "delete" else "corrupt ("
        assert expected in line, line


def test_a_connection_made_after_the_ledger_was_deleted_never_recreates_it(tmp_path):
    db, root = ledger_with_jobs(tmp_path, n=1)
    with Coordinator.open(f"sqlite:///{db}", root=root) as c:
        c.engine.dispose()  # the next read needs a new connection, as a thread's first one does
        db.unlink()
        with pytest.raises(sa.exc.OperationalError, match="unable to open database file"):
            c.queue.pending_unserved()
        assert not db.exists()


def test_a_connection_made_to_a_ledger_emptied_under_the_process_fails_at_once_naming_it(tmp_path):
    db, root = ledger_with_jobs(tmp_path, n=1)
    with Coordinator.open(f"sqlite:///{db}", root=root) as c:
        c.queue.claim("w")  # this thread's write connection holds the file open, with its locks
        os.truncate(db, 0)
        c.engine.dispose()  # the next read needs a new connection
        with pytest.raises(sa.exc.OperationalError, match=r"is empty \(0 bytes\)"):
            c.queue.pending_unserved()


# -- read-only -----------------------------------------------------------------------------------


@contextmanager
def read_only_file(path: Path):
    """``path`` made read-only in a way that holds for root too: the immutable attribute
    (chattr +i, ext4/xfs/btrfs) as root, a plain chmod otherwise. Fails, never skips, if
    neither takes."""
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        undo = ["chattr", "-i", str(path)]
        if made.returncode != 0:
            pytest.fail(f"cannot make {path} read-only as root: chattr +i: {made.stderr.strip()}")
    else:
        path.chmod(0o444)
        undo = None
    try:
        with pytest.raises(PermissionError):
            open(path, "r+b").close()
        yield
    finally:
        if undo:
            subprocess.run(undo, check=True)
        else:
            path.chmod(0o644)


def test_a_read_only_ledger_stops_the_worker_with_one_line_and_exit_74(tmp_path):
    db, root = ledger_with_jobs(tmp_path, n=3)
    with read_only_file(db):
        proc = cli(db, root, "worker", "--until-idle")
        assert proc.returncode == 74
        assert last_line(proc) == (
            f"tether: ledger fault: the ledger at {db} is read-only (OperationalError: attempt to write a readonly "
            "database); make it writable (file permissions, mount, database role), then start the worker again"
        )
        proc = cli(db, root, "jobs", "--json")  # reading it still works
        assert proc.returncode == 0 and len(orjson.loads(proc.stdout)["jobs"]) == 3
    proc = cli(db, root, "worker", "--until-idle", "--quiet")
    assert proc.returncode == 0 and len(list(root.glob("f*.json"))) == 3


# -- full ----------------------------------------------------------------------------------------


def test_a_full_ledger_stops_the_worker_and_no_job_is_lost_once_space_returns(tmp_path):
    notes = NoteType()
    db = tmp_path / "tether.db"
    c = Coordinator.open(f"sqlite:///{db}", root=tmp_path / "data", registry=registry_with(notes))
    try:
        c.enqueue_many([Note(name=f"n{i}") for i in range(300)])
        with c.engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()

        def no_room(dbapi_conn, _record):  # noqa: ANN001
            dbapi_conn.execute(f"PRAGMA max_page_count={pages}")  # SQLITE_FULL past today's size

        sa.event.listen(c.engine, "connect", no_room)
        c.queue.backend.close()
        c.engine.dispose()
        with pytest.raises(LedgerFault, match=r"is full \(OperationalError: database or disk is full\)"):
            run_bounded(c.worker(poll_interval=0.01, max_db_backoff=0.02))

        sa.event.remove(c.engine, "connect", no_room)
        c.queue.backend.close()
        c.engine.dispose()
        c.worker(poll_interval=0.01).run_until_idle(install_signals=False)
        with c.engine.connect() as conn:
            counts: dict[str, int] = dict(
                conn.exec_driver_sql("SELECT status, count(*) FROM tether_jobs GROUP BY status").all()
            )
        assert counts == {"completed": 300} and set(notes.seen) == {f"n{i}" for i in range(300)}
    finally:
        c.close()


# -- fatal or transient: told by the driver's code -----------------------------------------------


def sqlite_error(message: str, code: int) -> sa.exc.OperationalError:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = code
    return sa.exc.OperationalError("UPDATE tether_jobs ...", {}, error)


def postgres_error(error: Exception) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE tether_jobs ...", {}, error)


@pytest.mark.parametrize(
    ("error", "fatal"),
    [
        (lambda: sqlite_error("database is locked", 5), False),  # SQLITE_BUSY: retried with backoff
        (lambda: sqlite_error("database table is locked", 6), False),  # SQLITE_LOCKED
        (lambda: postgres_error(psycopg.OperationalError("server closed the connection unexpectedly")), False),
        (lambda: postgres_error(psycopg.errors.AdminShutdown("terminating connection")), False),
        (lambda: sqlite_error("database or disk is full", 13), True),
        (lambda: sqlite_error("attempt to write a readonly database", 8), True),
        (lambda: sqlite_error("disk I/O error", 10 | (3 << 8)), True),  # SQLITE_IOERR_WRITE
        (lambda: sqlite_error("database disk image is malformed", 11), True),
        (lambda: postgres_error(psycopg.errors.DiskFull("could not extend file")), True),
        (lambda: postgres_error(psycopg.errors.ReadOnlySqlTransaction("read-only transaction")), True),
        (lambda: postgres_error(psycopg.errors.DataCorrupted("invalid page in block 7")), True),
    ],
)
def test_recording_retries_what_passes_and_stops_at_once_on_a_ledger_fault(make_coordinator, monkeypatch, error, fatal):
    notes = NoteType()
    c = make_coordinator(registry_with(notes))
    job_id = c.enqueue(Note(name="a")).id
    real = c.queue.finish_and_claim
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise error()
        return real(*args, **kwargs)

    monkeypatch.setattr(c.queue, "finish_and_claim", failing_once)
    w = c.worker(poll_interval=0.01, max_db_backoff=0.02)
    if not fatal:
        assert w.run_once() == 1 and len(calls) == 2
        assert c.get(job_id).status is JobStatus.COMPLETED
        return
    with pytest.raises(LedgerFault, match=str(error().orig).split()[0]) as raised:
        w.run_once()
    assert len(calls) == 1  # never retried
    assert w.fault is raised.value and w.producer.stopping.is_set()
    assert c.get(job_id).status is JobStatus.CLAIMED  # unrecorded: its lock goes stale, it runs again


def test_on_postgres_a_killed_connection_passes_but_a_dropped_ledger_table_stops_the_worker(tmp_path):
    with scratch_pg_database("tether_fault") as url:
        notes = NoteType()
        with Coordinator.open(url, root=tmp_path / "data", registry=registry_with(notes)) as c:
            c.enqueue(Note(name="a"))
            admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
            try:
                kill = (
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                with admin.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
                    assert c.queue.claim("warm-up", limit=0) == []  # the pool holds a connection
                    conn.exec_driver_sql(kill)
                assert run_bounded(c.worker(poll_interval=0.01, max_db_backoff=0.05)) == 1
                assert notes.seen == {"a": 1}

                c.enqueue(Note(name="b"))
                with admin.connect() as conn:
                    conn.exec_driver_sql("DROP TABLE tether_jobs")
                with pytest.raises(
                    LedgerFault, match=r"is gone \(UndefinedTable: relation \"tether_jobs\" does not exist"
                ):
                    run_bounded(c.worker(poll_interval=0.01, max_db_backoff=0.05))
            finally:
                admin.dispose()
