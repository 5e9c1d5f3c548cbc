"""``tether status`` on a SQLite file without SQLAlchemy (``observe/lite.py``): the same verdict
and figures as the SQLAlchemy path on varied ledgers, the same UNKNOWN line when the ledger
cannot be read, and statements that stay those of ``health`` (``statements/status.sql`` is current).
What the command loads, and its ``--json`` from a fresh interpreter: tests/test_cli_startup.py.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from test_observe import Work, WorkType, build_ledger
from tether import Coordinator, FakeClock
from tether.cli import main
from tether.jobtypes import default_registry
from tether.ledger import ledgerfile, schema, sqlitetime
from tether.observe import compile_lite, health, lite
from tether.observe.readonly import open_ledger
from tether.observe.verdict import Thresholds


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: the light path reads files (conftest's runs PostgreSQL too)."""
    return f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}"


def both(db_url: str, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``Health.to_dict()`` through SQLAlchemy, then through ``lite``."""
    engine = open_ledger(db_url)
    try:
        through_sqlalchemy = health.health(engine, **kwargs).to_dict()
    finally:
        engine.dispose()
    database = lite.sqlite_file(db_url)
    assert database is not None
    return through_sqlalchemy, lite.health(database, **kwargs).to_dict()


# -- the statements are those of health ----------------------------------------------------------


def test_the_compiled_statements_are_current() -> None:
    assert compile_lite.TARGET.read_text() == compile_lite.render(), (
        f"src/tether/ledger/statements/status.sql differs from the statements in health: run `{compile_lite.COMMAND}`"
    )
    assert ledgerfile.TABLE == schema.TABLE


@pytest.mark.parametrize(
    "when",
    [
        datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),  # no microseconds: still six digits
        datetime(2026, 7, 1, 1, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))),  # made UTC
        datetime(999, 12, 31, 23, 59, 59, 1, tzinfo=UTC),
    ],
)
def test_times_are_bound_as_sqlalchemy_binds_them(when: datetime) -> None:
    engine = sa.create_engine("sqlite://")
    with engine.connect() as conn:
        bound = conn.execute(sa.select(sa.cast(sa.bindparam("t", when, type_=schema.UTCDateTime), sa.Text))).scalar()
    assert sqlitetime.to_text(when) == bound


def test_only_a_plain_sqlite_file_url_is_read_without_sqlalchemy(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lite.sqlite_file("sqlite:///ledger/tether.db") == "ledger/tether.db"
    assert lite.sqlite_file("sqlite:////var/lib/tether.db") == "/var/lib/tether.db"
    for url in (
        "postgresql://app@db/app",
        "sqlite+pysqlite:///t.db",
        "sqlite:///t.db?timeout=5",
        "sqlite:///a%20b.db",
        "sqlite://",
        "sqlite:///:memory:",
    ):
        assert lite.sqlite_file(url) is None, url
    assert lite.sqlite_file("sqlite:///t.db", schema="tether") is None  # SQLAlchemy's path refuses it
    monkeypatch.setenv("TETHER_DB", "sqlite:///from-env.db")
    assert lite.sqlite_file(None) == "from-env.db"


# -- the same health on varied ledgers -----------------------------------------------------------


@pytest.fixture
def varied(make_coordinator: Callable[..., Coordinator], clock: FakeClock, db_url: str) -> Iterator[datetime]:
    """build_ledger's jobs (completed with run times, failed, retried, stuck, delayed pending), and
    outstanding jobs on two targets, one of them quarantined. Yields the ledger's last instant."""
    led = build_ledger(make_coordinator, clock)
    registry = default_registry()
    registry.register(WorkType())
    c = make_coordinator(registry=registry)
    for i in range(3):
        c.enqueue(Work(name=f"hot{i}", target="file:hot.json"))
    cold = c.enqueue(Work(name="cold", target="file:cold.json")).id
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(schema.jobs.update().where(schema.jobs.c.id == cold).values(quarantine="crashed"))
    engine.dispose()
    yield led.clock.now()


CASES = [
    # (seconds after the ledger's last instant, thresholds, lock timeout)
    (0, Thresholds(), None),
    (30, Thresholds(window=60), 50.0),
    (200, Thresholds(window=86400, p95_warn=0.5, p95_error=4, unclaimed_grace=10), None),
    (3700, Thresholds(backlog_limit=5, success_rate_warn=0.99, pending_age_warn=100), 5000.0),
    (86400 * 3, Thresholds(window=86400 * 7), 1.0),
]


@pytest.mark.parametrize(("after", "thresholds", "lock_timeout"), CASES)
def test_lite_and_sqlalchemy_give_the_same_health(
    varied: datetime, db_url: str, after: float, thresholds: Thresholds, lock_timeout: float | None
) -> None:
    now = varied + timedelta(seconds=after)
    through_sqlalchemy, through_lite = both(db_url, thresholds=thresholds, lock_timeout=lock_timeout, now=now)
    assert through_lite == through_sqlalchemy


def test_the_varied_ledger_exercises_every_figure(varied: datetime, db_url: str) -> None:
    """So that the comparison above compares something: each figure is set in some case."""
    _, h = both(db_url, thresholds=Thresholds(window=86400), now=varied + timedelta(seconds=200))
    assert (h["pending"], h["claimed"], h["failed"], h["stuck"], h["quarantined"]) == (7, 1, 2, 1, 1)
    assert h["deepest_target"] == {"key": "file:hot.json", "outstanding": 3}
    checks = {c["name"]: c["value"] for c in h["checks"]}
    assert checks["p95_duration:work"] == 5.0 and checks["p95_duration:create_file"] == 0.0
    assert 0 < checks["success_rate"] < 1 and h["oldest_pending_at"] and h["largest_pending_payload"]


def test_an_empty_ledger_reads_the_same(make_coordinator: Callable[..., Coordinator], clock: FakeClock, db_url: str):
    make_coordinator()
    through_sqlalchemy, through_lite = both(db_url, now=clock.now())
    assert through_lite == through_sqlalchemy and through_lite["verdict"] == "ok"


# -- the same UNKNOWN line when it cannot be read -------------------------------------------------


def _status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str, *args: str
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["tether", "--db", url, "status", *args])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Another connection holds the ledger exclusively (SQLite's locking_mode=EXCLUSIVE)."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("DELETE FROM tether_jobs")
    try:
        yield
    finally:
        holder.close()


@pytest.mark.parametrize("fault", ["missing", "directory", "empty", "corrupt", "no_table", "bad_table", "locked"])
def test_an_unreadable_ledger_is_reported_alike_on_both_paths(
    fault: str,
    tmp_path: Path,
    make_coordinator: Callable[..., Coordinator],
    db_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the UNKNOWN line unfolded
    monkeypatch.setattr("tether.config.BUSY_TIMEOUT", 0.2)  # locked: give up soon, on both paths
    path = tmp_path / "bad.db"
    holding = ExitStack()
    if fault == "directory":
        path.mkdir()
    elif fault == "empty":
        path.touch()
    elif fault == "corrupt":
        path.write_bytes(b"not a database, whatever its name says " * 200)
    elif fault in ("no_table", "bad_table"):
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE tether_jobs (x)" if fault == "bad_table" else "CREATE TABLE other (x)")
        conn.commit()
        conn.close()
    elif fault == "locked":
        c = make_coordinator()
        c.close()
        path = Path(db_url.removeprefix("sqlite:///"))
        holding.enter_context(_locked(path))
    url = f"sqlite:///{path}"
    read_without_sqlalchemy = lite.sqlite_file
    seen = []
    for light in (True, False):
        monkeypatch.setattr(lite, "sqlite_file", read_without_sqlalchemy if light else lambda *_: None)
        seen.append([_status(capsys, monkeypatch, url), _status(capsys, monkeypatch, url, "--json")])
    holding.close()
    assert seen[0] == seen[1]
    (code, out, _), _ = seen[0]
    assert code == 3 and out.startswith("UNKNOWN  "), out
    expected = {
        "missing": "the file does not exist",
        "directory": "it is a directory",
        "empty": "the file is empty",
        "corrupt": "is corrupt (DatabaseError: file is not a database)",
        "no_table": "has no tether_jobs table",
        "bad_table": "could not read the ledger: no such column",
        "locked": "cannot open the database at sqlite:///",
    }[fault]
    assert expected in out
    assert not (tmp_path / "bad.db").exists() or fault != "missing"


def test_the_reader_waits_for_a_lock_as_long_as_the_engine_does(
    make_coordinator: Callable[..., Coordinator], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_coordinator().close()
    monkeypatch.setattr("tether.config.BUSY_TIMEOUT", 7.5)
    engine = open_ledger(db_url)
    with engine.connect() as conn:
        engine_waits = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
    engine.dispose()
    database = lite.sqlite_file(db_url)
    assert database is not None
    reader = lite.connect(database)
    try:
        assert reader.execute("PRAGMA busy_timeout").fetchone()[0] == engine_waits == 7500
    finally:
        reader.close()
