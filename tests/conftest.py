"""Shared fixtures: a coordinator on each backend, a fake clock, a data root.

PostgreSQL tests need the server on 127.0.0.1:5432 (trust auth); .ci/run starts it. When it
cannot be reached they fail, never skip (set TETHER_TEST_PG=0 to leave that backend out locally).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from tether import Coordinator, FakeClock
from tether.jobtypes import Registry, default_registry
from tether.jobtypes.datafiles import nofollow

PG_ADMIN_URL = os.environ.get("TETHER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite"] + ([] if os.environ.get("TETHER_TEST_PG") == "0" else ["postgres"])


@contextmanager
def scratch_pg_database(prefix: str = "tether_test") -> Iterator[str]:
    """A new PostgreSQL database, dropped afterwards; fails (never skips) when the server is down."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
    except sa.exc.OperationalError as e:
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is unreachable ({e.orig}); start it (see .ci/run)")
    try:
        yield sa.make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A scratch PostgreSQL database for this test session."""
    with scratch_pg_database() as url:
        yield url


def drop_ledger(conn: sa.Connection) -> None:
    """Every table of a ledger, as the schema declares them: a PostgreSQL database shared by tests
    starts empty, and a table the schema gains is never missed from a list kept by hand."""
    from tether.ledger.schema import metadata

    metadata.drop_all(conn, checkfirst=True)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The ledger URL on each backend, empty at the start of the test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}"
        return
    url = request.getfixturevalue("pg_database")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        drop_ledger(conn)
    engine.dispose()
    yield url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def make_coordinator(db_url: str, root: Path, clock: FakeClock) -> Iterator[Callable[..., Coordinator]]:
    """Build coordinators on the test's ledger; all are closed at the end."""
    opened: list[Coordinator] = []

    def make(registry: Registry | None = None, **kwargs) -> Coordinator:
        kwargs.setdefault("clock", clock)
        c = Coordinator.open(db_url, root=root, registry=registry or default_registry(), **kwargs)
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.close()


@pytest.fixture
def coordinator(make_coordinator: Callable[..., Coordinator]) -> Coordinator:
    return make_coordinator()


@pytest.fixture(params=["openat2", "walk"])
def lookup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How paths under the data root are opened: Linux openat2 (where the kernel has it), or the
    portable per-component walk (``pytestmark = pytest.mark.usefixtures("lookup")`` runs a
    module's tests with each)."""
    monkeypatch.setattr(nofollow, "_usable", None if request.param == "openat2" else False)
    return request.param
