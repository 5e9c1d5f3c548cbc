"""A ledger in its own PostgreSQL schema, for databases shared by several applications."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from clikit import run_split
from tether import Coordinator, CreateFile, JobStatus
from tether.errors import ConfigError, JobNotFound


@pytest.fixture
def shared_db(pg_database):
    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        for schema in ("app_one", "app_two"):
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.exec_driver_sql("DROP TABLE IF EXISTS public.tether_jobs")
        conn.exec_driver_sql("DROP TABLE IF EXISTS public.tether_meta")
    yield pg_database, engine
    with engine.begin() as conn:
        for schema in ("app_one", "app_two"):
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    engine.dispose()


def test_two_applications_keep_separate_ledgers_in_one_database(shared_db, tmp_path):
    url, admin = shared_db
    with (
        Coordinator.open(url, root=tmp_path / "one", schema="app_one") as one,
        Coordinator.open(url, root=tmp_path / "two", schema="app_two") as two,
    ):
        a = one.enqueue(CreateFile(path="a.json", content=1)).id
        assert one.run_until_idle() == 1 and two.run_until_idle() == 0
        assert one.get(a).status is JobStatus.COMPLETED
        with pytest.raises(JobNotFound):  # the other schema's ledger has never seen it
            two.get(a)
    with admin.connect() as conn:
        tables = (
            conn.execute(
                sa.text(
                    "SELECT table_schema FROM information_schema.tables WHERE table_name = 'tether_jobs' ORDER BY 1"
                )
            )
            .scalars()
            .all()
        )
    assert tables == ["app_one", "app_two"]  # created on demand, nothing in public


def test_a_schema_name_that_is_not_a_plain_identifier_is_refused(pg_database, tmp_path):
    with pytest.raises(ConfigError, match="is not a plain identifier"):
        Coordinator.open(pg_database, root=tmp_path, schema="x; DROP TABLE y")


def test_schema_is_refused_for_sqlite(tmp_path):
    with pytest.raises(ConfigError, match="PostgreSQL only"):
        Coordinator.open(f"sqlite:///{tmp_path / 'l.db'}", root=tmp_path, schema="app")


def test_an_application_session_enqueues_into_the_ledgers_schema(shared_db, tmp_path):
    from sqlalchemy.orm import Session

    url, admin = shared_db
    app_engine = sa.create_engine(url, connect_args={"options": "-csearch_path=app_two,public"})
    with (
        Coordinator.open(url, root=tmp_path / "one", schema="app_one") as one,
        Coordinator.open(url, root=tmp_path / "two", schema="app_two"),
    ):
        with Session(app_engine) as session:
            job = one.enqueue(CreateFile(path="a.json", content=1), session=session).id
            # The application's own statements after it still find its own tables first.
            assert session.execute(sa.text("SHOW search_path")).scalar() == "app_two,public"
            session.commit()
        assert one.get(job).status is JobStatus.PENDING
    with admin.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM app_two.tether_jobs")).scalar() == 0
    app_engine.dispose()


def test_a_mistyped_schema_is_named_where_the_ledger_is_not_found(shared_db, tmp_path, monkeypatch, capsys):
    """status (a read) and enqueue (a write, which never creates a ledger from the command line)
    both say which schema has no ledger, so a mistyped --schema reads as one."""
    url, _ = shared_db
    Coordinator.open(url, root=tmp_path, schema="app_one").close()
    code, out, err = run_split(monkeypatch, capsys, "--db", url, "--schema", "app_onw", "status")
    assert code == 3 and "its schema 'app_onw' has no tether_jobs table; check --db and --schema" in out
    payload = '{"path": "a.json", "content": 1}'
    code, _, err = run_split(
        monkeypatch, capsys, "--db", url, "--schema", "app_onw", "enqueue", "create_file", "-p", payload
    )
    assert code == 1 and "its schema 'app_onw' has no tether_jobs table" in err.strip().splitlines()[-1]
