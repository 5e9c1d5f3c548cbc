"""What docs/scaling.md promises about running on several machines: SQLite on a network
filesystem is refused with a clear error, and (a proof of concept for the schema option) two
applications can keep separate ledgers in one PostgreSQL database through ``search_path``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import tether.ledger.engine
from tether import ConfigError, Coordinator, CreateFile, JobStatus

# -- SQLite on a network filesystem ----------------------------------------------------------


@pytest.mark.parametrize("fs_type", ["nfs4", "cifs", "fuse.sshfs"])
def test_sqlite_ledger_on_a_network_filesystem_is_refused_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fs_type: str
) -> None:
    monkeypatch.setattr(tether.ledger.engine, "_filesystem_type", lambda _directory: fs_type)
    ledger = tmp_path / "shared" / "tether.db"
    with pytest.raises(ConfigError) as info:
        Coordinator.open(f"sqlite:///{ledger}", root=tmp_path / "data")
    message = str(info.value)
    assert str(ledger) in message
    assert f"{fs_type} network filesystem" in message
    assert "local disk" in message and "PostgreSQL" in message  # what to do instead
    assert not ledger.exists(), "the refused ledger was created anyway"


def test_sqlite_ledger_on_a_local_filesystem_opens(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tether.ledger.engine, "_filesystem_type", lambda _directory: "ext4")
    with Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data") as c:
        assert c.enqueue(CreateFile(path="a.json", content={})).job.status is JobStatus.PENDING


def test_cli_reports_the_network_filesystem_refusal_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tether.cli import main

    monkeypatch.setattr(tether.ledger.engine, "_filesystem_type", lambda _directory: "nfs4")
    ledger = tmp_path / "tether.db"
    monkeypatch.setattr(sys, "argv", ["tether", "--db", f"sqlite:///{ledger}", "--root", str(tmp_path), "init"])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("tether: error: ") and "nfs4 network filesystem" in err
    assert "Traceback" not in err


# -- proof of concept: one database, one schema per application -------------------------------


@pytest.fixture
def two_schemas(pg_database: str) -> Iterator[tuple[str, str, sa.Engine]]:
    """URLs that put tether's table in schema app_a or app_b (libpq ``options`` sets
    ``search_path`` for every connection), and an admin engine on the same database."""
    admin = sa.create_engine(pg_database)
    with admin.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_jobs")
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_meta")
        for schema in ("app_a", "app_b"):
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    url = sa.make_url(pg_database)
    urls = [
        url.update_query_dict({"options": f"-csearch_path={s}"}).render_as_string(hide_password=False)
        for s in ("app_a", "app_b")
    ]
    yield urls[0], urls[1], admin
    with admin.begin() as conn:
        for schema in ("app_a", "app_b"):
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    admin.dispose()


def test_search_path_option_keeps_two_ledgers_apart_in_one_database(two_schemas, tmp_path: Path) -> None:
    url_a, url_b, admin = two_schemas
    with Coordinator.open(url_a, root=tmp_path / "a") as a, Coordinator.open(url_b, root=tmp_path / "b") as b:
        job = a.enqueue(CreateFile(path="x.json", content={"n": 1})).job
        assert b.run_until_idle() == 0  # b's ledger does not see a's job
        assert a.run_until_idle() == 1
        assert a.get(job.id).status is JobStatus.COMPLETED
        assert (tmp_path / "a" / "x.json").exists() and not (tmp_path / "b" / "x.json").exists()
    with admin.connect() as conn:
        tables = conn.execute(
            sa.text(
                "SELECT table_schema, count(*) FROM information_schema.tables WHERE table_name = 'tether_jobs' "
                "GROUP BY table_schema ORDER BY 1"
            )
        ).all()
        indexes = conn.execute(
            sa.text("SELECT schemaname, count(*) FROM pg_indexes WHERE tablename = 'tether_jobs' GROUP BY 1 ORDER BY 1")
        ).all()
    assert [tuple(t) for t in tables] == [("app_a", 1), ("app_b", 1)]  # nothing in public
    assert indexes[0][0] == "app_a" and indexes[1][0] == "app_b" and indexes[0][1] == indexes[1][1] >= 5
