"""Opening a ledger an earlier version left brings its columns and indexes up to date (SQLite and
PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile, JobStatus
from tether.jobtypes import default_registry
from tether.ledger import meta
from tether.ledger.engine import create_engine, ensure_schema, layout
from tether.ledger.lifecycle import Decision
from tether.ledger.schema import RECORD_COLUMNS as COLUMNS
from tether.ledger.schema import jobs


def forget_layout(conn: sa.Connection) -> None:
    """Earlier versions recorded no layout (``meta.LAYOUT``): an open that finds none ensures the
    schema; one that finds its own skips that."""
    conn.exec_driver_sql(f"DELETE FROM tether_meta WHERE key = '{meta.LAYOUT}'")


def index_names(url: str) -> set[str | None]:
    engine = create_engine(url)
    try:
        return {ix["name"] for ix in sa.inspect(engine).get_indexes("tether_jobs")}
    finally:
        engine.dispose()


def test_an_older_ledger_gets_the_indexes_added_since_and_loses_the_retired_ones(db_url, tmp_path):
    Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()).close()
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as an earlier version left it
        forget_layout(conn)
        conn.exec_driver_sql("CREATE INDEX ix_tether_jobs_claim ON tether_jobs (status, priority DESC, created_at, id)")
        conn.exec_driver_sql("CREATE INDEX ix_tether_jobs_finished ON tether_jobs (status, completed_at)")
        conn.exec_driver_sql(
            "CREATE INDEX ix_tether_jobs_pending ON tether_jobs (priority DESC, created_at, id)"
            " WHERE status = 'pending'"
        )
        conn.exec_driver_sql("DROP INDEX ix_tether_jobs_queue")  # all came after those
        conn.exec_driver_sql("DROP INDEX ix_tether_jobs_done")
        conn.exec_driver_sql("DROP INDEX ix_tether_jobs_on_target")  # schema 15's, with status
        conn.exec_driver_sql(
            "CREATE INDEX ix_tether_jobs_targeted ON tether_jobs (ordering_key, id, status, type)"
            " WHERE ordering_key IS NOT NULL"
        )
    engine.dispose()

    Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()).close()

    names = index_names(db_url)
    retired = {"ix_tether_jobs_claim", "ix_tether_jobs_finished", "ix_tether_jobs_pending", "ix_tether_jobs_targeted"}
    assert not retired & names
    assert {index.name for index in jobs.indexes} <= names


def column_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {column["name"] for column in sa.inspect(engine).get_columns("tether_jobs")}
    finally:
        engine.dispose()


def test_an_older_ledger_gets_the_quarantine_column_and_its_index_and_keeps_its_jobs(db_url, tmp_path):
    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        job_id = c.enqueue(CreateFile(path="a.json", text="a")).id
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as the version before quarantine (issue 22) left it
        forget_layout(conn)
        conn.exec_driver_sql("DROP INDEX ix_tether_jobs_quarantined")
        conn.exec_driver_sql("ALTER TABLE tether_jobs DROP COLUMN quarantine")
    engine.dispose()
    assert "quarantine" not in column_names(db_url)

    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        assert c.get(job_id).quarantine is None
        assert c.run_until_idle() == 1
        assert c.get(job_id).status is JobStatus.COMPLETED

    assert set(COLUMNS) <= column_names(db_url)
    assert "ix_tether_jobs_quarantined" in index_names(db_url)


def test_opening_an_up_to_date_ledger_runs_no_index_statement(db_url, tmp_path):
    # On PostgreSQL even CREATE INDEX IF NOT EXISTS would lock the table against every writer.
    Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()).close()
    engine = create_engine(db_url)
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda conn, cur, stmt, *rest: statements.append(stmt))
    try:
        ensure_schema(engine)
    finally:
        engine.dispose()
    assert not [s for s in statements if "INDEX" in s.upper() and not s.lstrip().upper().startswith("SELECT")]
    assert not [s for s in statements if s.lstrip().upper().startswith("ALTER")]


def test_an_older_ledger_gets_the_columns_added_since_and_keeps_its_jobs(db_url, tmp_path):
    from tether import CreateFile

    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        old = c.enqueue(CreateFile(path="a.json", content=1)).id
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as a version without per-job timeouts left it
        forget_layout(conn)
        conn.exec_driver_sql("ALTER TABLE tether_jobs DROP COLUMN timeout")
    engine.dispose()

    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        new = c.enqueue(CreateFile(path="b.json", content=2), timeout=5).id
        assert c.get(old).timeout is None and c.get(new).timeout == 5.0
        assert c.run_until_idle() == 2


def test_an_older_ledger_gets_the_blocked_flag_on_its_waiting_jobs_and_runs_them_in_order(db_url, tmp_path):
    from jobkit import Note, NoteType, registry_with

    notes = NoteType()
    with Coordinator.open(db_url, root=tmp_path / "data", registry=registry_with(notes)) as c:
        ids = [c.enqueue(Note(name=f"{i}", target="t")).id for i in range(3)]
        other = c.enqueue(Note(name="o", target="u")).id
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as the version before the flag (issue 23) left it
        forget_layout(conn)
        conn.exec_driver_sql("DROP INDEX ix_tether_jobs_queue")
        conn.exec_driver_sql("ALTER TABLE tether_jobs DROP COLUMN blocked")
    engine.dispose()

    with Coordinator.open(db_url, root=tmp_path / "data", registry=registry_with(notes)) as c:
        with c.engine.connect() as conn:
            blocked: dict[str, Any] = {
                row[0]: row[1] for row in conn.exec_driver_sql("SELECT id, blocked FROM tether_jobs")
            }
        assert [bool(blocked[i]) for i in [*ids, other]] == [False, True, True, False]
        assert c.run_until_idle() == 4
    assert [name for name, _ in notes.runs if name != "o"] == ["0", "1", "2"]


def test_an_older_ledger_gets_the_payload_sizes_of_the_jobs_that_may_still_run(db_url, tmp_path):
    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        done, failed = (c.enqueue(CreateFile(path=f"{n}.txt", text=n)).id for n in ("done", "failed"))
        c.run_until_idle()
        pending = c.enqueue(CreateFile(path="pending.txt", text="é" * 100)).id
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as the version before payload sizes (issue 24) left it
        forget_layout(conn)
        conn.execute(sa.text("UPDATE tether_jobs SET status = 'failed' WHERE id = :id"), {"id": failed})
        conn.exec_driver_sql("ALTER TABLE tether_jobs DROP COLUMN payload_bytes")
    engine.dispose()

    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        sizes = {job_id: c.get(job_id).payload_bytes for job_id in (done, failed, pending)}
        payloads = {job_id: c.get(job_id).payload for job_id in (failed, pending)}

    assert sizes[done] is None  # finished for good: left as it was
    assert {job_id: sizes[job_id] for job_id in payloads} == {
        job_id: len(payload.encode("utf-8")) for job_id, payload in payloads.items()
    }


def opening_statements(monkeypatch: Any, db_url: str, root: Any) -> list[str]:
    """The statements one ``Coordinator.open`` sends (those SQLAlchemy sees), with ensure_schema
    made to fail: an open that needs it cannot pass."""
    import tether.coordinator
    import tether.ledger.meta

    statements: list[str] = []

    def watched(*args: Any, **kwargs: Any) -> sa.Engine:
        engine = create_engine(*args, **kwargs)
        sa.event.listen(engine, "before_cursor_execute", lambda conn, cur, stmt, *rest: statements.append(stmt))
        return engine

    def refused(engine: sa.Engine) -> bool:
        raise AssertionError("ensure_schema ran")

    with monkeypatch.context() as m:
        m.setattr(tether.coordinator, "create_engine", watched)
        m.setattr(tether.ledger.meta, "ensure_schema", refused)
        Coordinator.open(db_url, root=root, registry=default_registry()).close()
    return statements


def test_opening_a_ledger_this_version_set_up_is_one_read_of_its_meta(db_url, tmp_path, monkeypatch):
    # An application opens a coordinator at start-up, a CLI enqueue on every run (issue 19).
    Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()).close()
    statements = opening_statements(monkeypatch, db_url, tmp_path / "data")
    on_tables = [s for s in statements if "tether_" in s]
    assert on_tables == ["SELECT key, value FROM tether_meta"]
    assert not [s for s in statements if s.strip().upper().startswith("BEGIN IMMEDIATE")]  # no write lock taken


def test_an_open_that_finds_another_layout_recorded_ensures_the_schema_and_records_its_own(db_url, tmp_path):
    Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()).close()
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as a version with other tables or indexes left it
        conn.exec_driver_sql(f"UPDATE tether_meta SET value = 'another' WHERE key = '{meta.LAYOUT}'")
        conn.exec_driver_sql("DROP INDEX ix_tether_jobs_done")
    engine.dispose()

    Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()).close()

    assert "ix_tether_jobs_done" in index_names(db_url)
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            assert meta.read(conn)[meta.LAYOUT] == layout()
    finally:
        engine.dispose()


def test_an_older_ledger_gets_the_attempts_table_and_its_retried_jobs_leave_rows(db_url, tmp_path):
    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        job_id = c.enqueue(CreateFile(path="a.json", text="a")).id
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as schema 5 left it
        forget_layout(conn)
        conn.exec_driver_sql("DROP TABLE tether_attempts")
        conn.exec_driver_sql(f"UPDATE tether_meta SET value = '5' WHERE key = '{meta.VERSION}'")
    engine.dispose()
    assert "tether_attempts" not in table_names(db_url)

    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        [job] = c.queue.claim("w1")
        c.queue.finish_and_claim("w1", [Decision.release(job)])
        assert [e.outcome for e in c.history("a.json").entries[1:]] == ["given_back"]
        assert c.get(job_id).status is JobStatus.PENDING

    assert "tether_attempts" in table_names(db_url)


def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_an_older_ledger_gets_the_cancelled_status_its_cancel_column_and_paused_table(db_url, tmp_path):
    from tether.ledger.schema import STATUS_CHECK, TABLE

    old = sa.MetaData()  # the jobs table as version 5 made it: four statuses, no cancel_reason
    sa.Table(
        TABLE,
        old,
        *[column._copy() for column in jobs.columns if column.name != "cancel_reason"],
        sa.CheckConstraint("status IN ('pending', 'claimed', 'completed', 'failed')", name=STATUS_CHECK),
    )
    if db_url.startswith("sqlite"):
        (tmp_path / "ledger").mkdir(exist_ok=True)
    engine = sa.create_engine(db_url)  # not tether's: it would make a new SQLite ledger as this version does
    old.create_all(engine)
    engine.dispose()
    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        job_id = c.enqueue(CreateFile(path="a.json", content=1)).id
        [result] = c.cancel(job_id)
        assert c.get(job_id).status is JobStatus.CANCELLED, result
        c.pause("create_file")
        assert c.resume("create_file")
        with c.engine.begin() as conn, pytest.raises(sa.exc.IntegrityError):
            conn.exec_driver_sql(f"UPDATE tether_jobs SET status = 'lost' WHERE id = '{job_id}'")
        if c.engine.dialect.name == "sqlite":
            with c.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        else:  # widened without the scan of every row a validated constraint makes
            with c.engine.connect() as conn:
                validated = conn.exec_driver_sql(
                    f"SELECT convalidated FROM pg_constraint WHERE conname = '{STATUS_CHECK}'"
                    " AND conrelid = 'tether_jobs'::regclass"
                ).scalar_one()
            assert validated is False


def test_a_ledger_from_before_snoozes_tags_and_meta_gets_them_and_keeps_its_jobs(db_url, tmp_path):
    from tether import CreateFile
    from tether.observe.tags import notes

    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        old = c.enqueue(CreateFile(path="a.json", content=1)).id
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as schema 5 left it
        forget_layout(conn)
        conn.exec_driver_sql("DROP INDEX ix_tether_jobs_retry_of")
        for column in ("snoozes", "meta", "retry_of"):
            conn.exec_driver_sql(f"ALTER TABLE tether_jobs DROP COLUMN {column}")
        conn.exec_driver_sql("DROP TABLE tether_job_tags")
    engine.dispose()

    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        assert c.get(old).snoozes == 0
        new = c.enqueue(CreateFile(path="b.json", content=2), tags=["t:1"], meta={"m": 1}).id
        assert notes(c, [new])[new]["tags"] == ["t:1"] and notes(c, [new])[new]["meta"] == {"m": 1}
        assert "ix_tether_jobs_retry_of" in index_names(db_url)
        assert c.run_until_idle() == 2


def test_a_ledger_of_schema_10_gets_the_trace_columns_and_keeps_its_jobs(db_url, tmp_path):
    """Schema 12 adds ``traceparent`` to the jobs and the attempts, each only where it is missing."""
    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        old = c.enqueue(CreateFile(path="a.json", content=1)).id
    engine = create_engine(db_url)
    with engine.begin() as conn:  # as schema 10 left it
        forget_layout(conn)
        for table in ("tether_jobs", "tether_attempts"):
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN traceparent")
        conn.exec_driver_sql(f"UPDATE tether_meta SET value = '10' WHERE key = '{meta.VERSION}'")
    engine.dispose()

    with Coordinator.open(db_url, root=tmp_path / "data", registry=default_registry()) as c:
        assert c.get(old).traceparent is None
        assert "traceparent" in column_names(db_url)
        with c.engine.connect() as conn:
            known = meta.read(conn)
            attempt_columns = {col["name"] for col in sa.inspect(conn).get_columns("tether_attempts")}
        assert known[meta.VERSION] == str(meta.SCHEMA_VERSION)
        assert "traceparent" in attempt_columns
        c.enqueue(CreateFile(path="b.json", content=2))
        assert c.run_until_idle() == 2
    again = create_engine(db_url)
    ensure_schema(again)  # a second upgrade finds nothing missing
    again.dispose()


def test_a_sqlite_status_check_spelled_as_a_list_is_respelled_as_comparisons_and_refuses_what_it_did(tmp_path):
    from tether.ledger.schema import STATUS_CHECK, STATUS_CHECK_SQL

    url = f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}"
    with Coordinator.open(url, root=tmp_path / "data", registry=default_registry()) as c:
        job_id = c.enqueue(CreateFile(path="a.json", content=1)).id
    listed = "status IN ('pending', 'claimed', 'completed', 'failed', 'cancelled')"  # as schema 14 wrote it
    engine = create_engine(url)
    with engine.begin() as conn:
        forget_layout(conn)
        definition = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'tether_jobs'").scalar_one()
        cookie = conn.exec_driver_sql("PRAGMA schema_version").scalar_one()
        conn.exec_driver_sql("PRAGMA writable_schema = ON")
        conn.exec_driver_sql(
            "UPDATE sqlite_master SET sql = ? WHERE name = 'tether_jobs'",
            (definition.replace(f"CHECK ({STATUS_CHECK_SQL})", f"CHECK ({listed})"),),
        )
        conn.exec_driver_sql(f"PRAGMA schema_version = {cookie + 1}")
        conn.exec_driver_sql("PRAGMA writable_schema = OFF")
    engine.dispose()

    with Coordinator.open(url, root=tmp_path / "data", registry=default_registry()) as c:
        with c.engine.connect() as conn:
            definition = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'tether_jobs'").scalar_one()
            assert f"CONSTRAINT {STATUS_CHECK} CHECK ({STATUS_CHECK_SQL})" in definition and listed not in definition
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        with c.engine.begin() as conn, pytest.raises(sa.exc.IntegrityError):
            conn.exec_driver_sql(f"UPDATE tether_jobs SET status = 'lost' WHERE id = '{job_id}'")
        assert c.run_until_idle() == 1 and c.get(job_id).status is JobStatus.COMPLETED
