"""What the command line loads before it answers (issue 15, item 5; benchmarks/cli_startup.py has
the times): ``--help`` no SQLAlchemy at all; ``status`` on a SQLite file neither SQLAlchemy nor
pydantic (``observe/lite.py``); the other read commands SQLAlchemy Core and the driver, never the
ORM, SQLModel, the table classes of ``tether.ledger.orm`` or the job types (pydantic models). Each
command runs in a fresh interpreter, which prints the modules it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether import Coordinator, CreateFile

# Run the CLI's entry point, then print (at exit, whatever the exit code) the modules loaded.
_PROBE = """
import atexit, json, sys
atexit.register(lambda: sys.__stderr__.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n"))
from tether.cli import main
sys.argv = ["tether", *sys.argv[1:]]
main()
"""

# What a read command must not pay for: the ORM and SQLModel (tether.ledger.orm's typed rows), the
# job types with their payload models, and pydantic (typer 0.28+ parses options with it: pinned below).
HEAVY = (
    "sqlmodel",
    "sqlalchemy.orm",
    "tether.ledger.orm",
    "tether.jobtypes",
    "tether.coordinator",
    "tether.ledger.limits",
    "pydantic",
)


def loaded(args: list[str], env: dict[str, str]) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    line = next((x for x in done.stderr.splitlines() if x.startswith("MODULES ")), None)
    assert line is not None, done.stderr
    return set(json.loads(line.removeprefix("MODULES ")))


@pytest.fixture(scope="module")
def ledger_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("startup")
    db = f"sqlite:///{tmp / 'tether.db'}"
    with Coordinator.open(db, root=tmp / "data") as c:
        c.enqueue(CreateFile(path="a.json", content={"a": 1}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return {**env, "TETHER_DB": db}


def test_help_loads_no_sqlalchemy(ledger_env: dict[str, str]) -> None:
    modules = loaded(["--help"], ledger_env)
    assert "tether.cli.status" in modules  # the probe saw the whole command line load
    assert not {m for m in modules if m.split(".")[0] in ("sqlalchemy", "sqlmodel")}


@pytest.mark.parametrize("command", ["jobs", "failed", "stuck"])
def test_read_command_loads_sqlalchemy_core_only(command: str, ledger_env: dict[str, str]) -> None:
    modules = loaded([command, "--json"], ledger_env)
    assert "tether.observe" in modules and "sqlalchemy.engine" in modules  # it did read the ledger
    heavy = sorted(m for m in modules if m.startswith(HEAVY))
    assert heavy == [], f"tether {command} loaded {heavy[:8]}"


def test_status_on_a_sqlite_file_loads_neither_sqlalchemy_nor_pydantic(ledger_env: dict[str, str]) -> None:
    modules = loaded(["status", "--json"], ledger_env)
    assert "tether.observe.lite" in modules and "sqlite3" in modules  # it did read the ledger
    heavy = sorted(m for m in modules if m.split(".")[0] in ("sqlalchemy", "pydantic", "sqlmodel"))
    assert heavy == [], f"tether status loaded {heavy[:8]}"


# What an enqueue (``Coordinator.open`` + ``enqueue``: an application at start-up, a CLI enqueue
# on every run) must not pay for: 100-200 ms of imports it never uses (issue 19).
NOT_FOR_ENQUEUE = (
    "tether.worker",
    "tether.reconcile",
    "tether.observe",
    "sqlalchemy.orm",
    "jsonschema",
)


def test_an_enqueue_loads_no_worker_reconcile_observe_orm_or_jsonschema(
    ledger_env: dict[str, str], tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'tether.db'}"  # its own: the other tests count the shared one's jobs
    Coordinator.open(db, root=tmp_path / "data").close()
    env = {**ledger_env, "TETHER_DB": db}
    modules = loaded(["enqueue", "create_file", "--payload", '{"path": "b.json", "content": 1}'], env)
    assert "tether.coordinator" in modules and "tether.ledger.queue" in modules  # it did enqueue
    heavy = sorted(m for m in modules if m.startswith(NOT_FOR_ENQUEUE))
    assert heavy == [], f"tether enqueue loaded {heavy[:8]}"


# The probe at one fixed instant: the CLI reads the system clock, and --json says when it looked.
_AT_NOON = _PROBE.replace(
    "from tether.cli import main",
    "from datetime import datetime\n"
    "from tether.clock import SystemClock\n"
    "SystemClock.now = staticmethod(lambda: datetime.fromisoformat('2030-06-01T12:00:00+00:00'))\n"
    "from tether.cli import main",
)


def test_status_json_is_the_same_without_sqlalchemy(ledger_env: dict[str, str]) -> None:
    """``sqlite+pysqlite:///`` names the same file, but only SQLAlchemy reads such a URL."""
    outputs, loaded_sqlalchemy = [], []
    for url in (ledger_env["TETHER_DB"], ledger_env["TETHER_DB"].replace("sqlite:", "sqlite+pysqlite:", 1)):
        done = subprocess.run(
            [sys.executable, "-c", _AT_NOON, "status", "--json"],
            env={**ledger_env, "TETHER_DB": url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 1, done.stderr  # a job pending since 2026: older than an hour at noon 2030
        outputs.append(json.loads(done.stdout))
        loaded_sqlalchemy.append("sqlalchemy" in done.stderr.split("MODULES ")[1])
    assert loaded_sqlalchemy == [False, True]
    assert outputs[0] == outputs[1]
    assert outputs[0]["now"] == "2030-06-01T12:00:00+00:00" and outputs[0]["pending"] == 1


def test_orm_rows_are_the_core_tables(tmp_path: Path) -> None:
    """tether.ledger.orm's classes map the Core tables themselves: a job enqueued through tether reads
    back as a typed row, and every column of each table is a field of its class."""
    from sqlmodel import Session, select

    from tether.ledger import orm, schema

    for model, table in ((orm.Job, schema.jobs), (orm.Meta, schema.meta), (orm.Schedule, schema.schedules)):
        assert model.__table__ is table
        assert list(model.model_fields) == list(table.c.keys())
    assert list(orm.ReconcileRun.model_fields) == list(schema.reconcile_runs.c.keys())
    assert list(orm.Attempt.model_fields) == list(schema.attempts.c.keys())
    with Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data") as c:
        job = c.enqueue(CreateFile(path="a.json", content={"a": 1}))
        with Session(c.engine) as session:
            row = session.exec(select(orm.Job).where(orm.Job.id == job.id)).one()
    assert (row.type, row.status, row.max_attempts) == ("create_file", "pending", job.job.max_attempts)
