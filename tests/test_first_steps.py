"""What a new user meets first: only ``tether init`` creates a ledger (a typo in --db is an
error) and says what it made; a worker says which pending jobs it cannot run and why; ``enqueue``
sets a job's own timeout with --job-timeout; a PostgreSQL URL without the driver is one line;
the package carries its license."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
import sqlalchemy as sa

from clikit import run_split
from conftest import scratch_pg_database
from tether import Coordinator, CreateFile
from tether.jobtypes import default_registry
from tether.ledger.meta import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[1]

STAMPS = """
from typing import ClassVar
from tether import JobType, Payload, Target, write_locked

class Stamp(Payload):
    job_type: ClassVar[str] = "stamp"
    path: str

class StampType(JobType[Stamp]):
    name = "stamp"
    payload_model = Stamp
    def target(self, p):
        return Target.file(p.path)
    def run(self, p, ctx):
        write_locked(ctx, p.path, b"stamped")

def register(registry):
    registry.register(StampType())
"""


def events(text: str, name: str) -> list[dict]:
    return [e for e in (json.loads(line) for line in text.splitlines() if line.startswith("{")) if e["event"] == name]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path):
    """``tether ARGS`` in this process, the working directory ``tmp_path`` (where --import finds
    stamps.py), no TETHER_* settings from outside."""
    for name in ("TETHER_DB", "TETHER_ROOT", "TETHER_IMPORT", "TETHER_SCHEMA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stamps.py").write_text(STAMPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "stamps", raising=False)
    return lambda *args: run_split(monkeypatch, capsys, *args)


# -- only init creates a ledger ---------------------------------------------------------------------


def test_a_typo_in_db_creates_nothing_and_init_creates_the_ledger_and_says_what(cli, tmp_path: Path) -> None:
    typo = tmp_path / "ledger" / "tehter.db"
    db, root = f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}", tmp_path / "data"
    for command in (["enqueue", "create_file", "-p", '{"path": "a.json", "content": 1}'], ["worker", "--until-idle"]):
        code, _, err = cli("--db", f"sqlite:///{typo}", "--root", str(root), *command)
        assert code == 1 and err.strip().splitlines()[-1].startswith(f"tether: error: no ledger at {typo} ("), err
        assert "tether init" in err
    assert not (tmp_path / "ledger").exists() and not root.exists()  # nothing made, not even the directory

    code, out, _ = cli("--db", db, "--root", str(root), "init")
    ledger_url = f"sqlite:///{tmp_path / 'ledger' / 'tether.db'}"
    assert (code, out) == (0, f"created the ledger {ledger_url}\n  data root {root}\n")
    assert (tmp_path / "ledger" / "tether.db").is_file() and root.is_dir()
    code, out, _ = cli("--db", db, "init", "--json")  # again: nothing new, the recorded root
    assert code == 0 and json.loads(out) == {
        "created": False,
        "ledger": ledger_url,
        "root": str(root),
        "upgraded_from": None,
    }

    code, out, _ = cli("--db", db, "worker", "--until-idle")
    [started] = events(out, "worker_started")
    assert (started["ledger"], started["root"]) == (ledger_url, str(root))


def test_a_reader_names_a_ledger_not_yet_upgraded_and_init_upgrades_it(cli, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    assert cli("--db", db, "--root", str(tmp_path / "data"), "init")[0] == 0
    with sa.create_engine(db).begin() as conn:  # as an older tether left it: no snoozes, version 8
        conn.exec_driver_sql("ALTER TABLE tether_jobs DROP COLUMN snoozes")
        conn.exec_driver_sql("UPDATE tether_meta SET value = '8' WHERE key = 'schema_version'")
    for command in ("jobs", "failed"):
        code, _, err = cli("--db", db, command)
        assert code == 1 and err.strip().splitlines() == [
            f"tether: error: this ledger has schema version 8 and this tether reads version {SCHEMA_VERSION}: "
            "run `tether init` (or start a worker) once to upgrade it in place; readers never write"
        ]
    code, out, _ = cli("--db", db, "init")
    assert code == 0 and out.startswith(f"the ledger {db} exists already: upgraded from schema 8 to {SCHEMA_VERSION}")
    assert cli("--db", db, "jobs")[0] == 0


def test_the_worker_names_a_postgresql_ledger_with_its_password_masked(cli, tmp_path: Path) -> None:
    with scratch_pg_database("tether_first_steps") as url:
        secret = sa.make_url(url).set(drivername="postgresql", password="s3cret-pw")
        db = secret.render_as_string(hide_password=False)
        code, out, err = cli("--db", db, "--root", str(tmp_path / "data"), "init")
        assert code == 0 and "s3cret-pw" not in out + err, err
        assert out.startswith(f"created the ledger postgresql://{secret.username}:***@")
        code, out, err = cli("--db", db, "worker", "--until-idle")
        [started] = events(out, "worker_started")
        assert started["ledger"] == secret.render_as_string(hide_password=True)
        assert started["root"] == str(tmp_path / "data") and "s3cret-pw" not in out + err


def test_an_application_still_creates_its_ledger_from_python_unless_told_not_to(tmp_path: Path) -> None:
    from tether.errors import NoLedger

    with pytest.raises(NoLedger, match="tether init"):
        Coordinator.open(f"sqlite:///{tmp_path / 'app.db'}", root=tmp_path / "data", create=False)
    assert not (tmp_path / "app.db").exists()
    with Coordinator.open(f"sqlite:///{tmp_path / 'app.db'}", root=tmp_path / "data") as c:  # the normal start-up
        assert c.enqueue(CreateFile(path="a.json", content=1)).job.type == "create_file"
    Coordinator.open(f"sqlite:///{tmp_path / 'app.db'}", create=False).close()  # it exists now


# -- a worker says which pending jobs it cannot run ----------------------------------------------------


def test_a_worker_without_the_import_names_the_jobs_it_leaves_waiting(cli, tmp_path: Path) -> None:
    db = ("--db", f"sqlite:///{tmp_path / 'tether.db'}", "--root", str(tmp_path / "data"))
    assert cli(*db, "init")[0] == 0
    code, _, err = cli(*db, "enqueue", "stamp", "-p", '{"path": "a.txt"}')
    assert code == 1 and err.strip().endswith("a type of your own needs --import MODULE"), err
    assert cli(*db, "--import", "stamps", "enqueue", "stamp", "-p", '{"path": "a.txt"}', "-q")[0] == 0
    code, out, err = cli(*db, "worker", "--until-idle")
    line = "tether worker: 1 pending job of a type this worker does not have: stamp (start it with --import MODULE)"
    assert code == 0 and err.splitlines().count(line) == 2, err  # when it starts, and when it is idle
    said = events(out, "types_not_registered")
    assert len(said) == 2 and said[0]["pending"] == 1 and said[0]["types"] == {"stamp": 1}
    code, out, err = cli(*db, "--import", "stamps", "worker", "--until-idle", "-q")
    assert code == 0 and "does not have" not in err and (tmp_path / "data" / "a.txt").read_bytes() == b"stamped"


def test_tether_import_takes_modules_separated_by_spaces_and_refuses_commas(cli, tmp_path: Path, monkeypatch) -> None:
    db = ("--db", f"sqlite:///{tmp_path / 'tether.db'}", "--root", str(tmp_path / "data"))
    assert cli(*db, "init")[0] == 0
    stamp = ("enqueue", "stamp", "-p", '{"path": "a.txt"}', "-q")
    monkeypatch.setenv("TETHER_IMPORT", "stamps,tether.demo.app")
    code, _, err = cli(*db, *stamp)
    assert (code, err.strip()) == (
        1,
        "tether: error: --import stamps,tether.demo.app: separate module names with spaces "
        "(TETHER_IMPORT='a b'), not commas",
    )
    monkeypatch.setenv("TETHER_IMPORT", "stamps tether.demo.app")
    assert cli(*db, *stamp)[0] == 0


def test_a_running_worker_names_them_each_time_it_runs_out_of_work(tmp_path: Path, caplog, monkeypatch) -> None:
    (tmp_path / "stamps.py").write_text(STAMPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "stamps", raising=False)
    import stamps  # type: ignore[import-not-found]

    db, root = f"sqlite:///{tmp_path / 'tether.db'}", tmp_path / "data"
    with_stamps = default_registry()
    stamps.register(with_stamps)
    with Coordinator.open(db, root=root, registry=with_stamps) as c:
        c.enqueue(stamps.Stamp(path="a.txt"))

    def said() -> list[dict]:
        return [json.loads(r.getMessage()) for r in caplog.records if '"types_not_registered"' in r.getMessage()]

    with Coordinator.open(db, root=root) as c, caplog.at_level(logging.INFO, "tether.events"):
        worker = c.worker(poll_interval=0.05)
        assert worker.unserved() == {"stamp": 1}
        c.enqueue(CreateFile(path="b.json", content=1))
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        try:
            deadline = time.monotonic() + 10
            while len(said()) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)  # reading the worker's log until it says it twice, up to a deadline
        finally:
            worker.stop()
            thread.join()
    assert worker.processed == 1  # b.json, never the stamp
    assert [(e["pending"], e["types"]) for e in said()] == [(1, {"stamp": 1})] * 2  # at start; idle after b.json


def test_the_unserved_check_names_the_types_at_the_queue_s_head_and_counts_them_exactly(make_coordinator, monkeypatch):
    from jobkit import Note, NoteType, registry_with
    from tether import CreateFile
    from tether.ledger import queue

    with_notes = make_coordinator(registry_with(NoteType()))
    with_notes.enqueue_many([Note(name=f"n{i}") for i in range(3)])
    served = make_coordinator()  # the built-in types only
    worker = served.worker()
    assert worker.unserved() == {"note": 3}
    monkeypatch.setattr(queue, "UNSERVED_LOOK", 1)
    assert worker.unserved() == {"note": 3}  # found in the head of one, counted whole
    served.enqueue(CreateFile(path="first.json", content={}), priority=9)
    assert worker.unserved() == {}  # the head is a job this worker runs: nothing past it is read


def test_a_failing_unserved_hook_does_not_stop_the_worker(make_coordinator) -> None:
    from jobkit import Note, NoteType, registry_with

    make_coordinator(registry_with(NoteType())).enqueue(Note(name="left"))
    served = make_coordinator()  # the built-in types only
    served.enqueue(CreateFile(path="ran.json", content=1))
    worker = served.worker()
    told: list[dict[str, int]] = []

    def broken_stream(unserved: dict[str, int]) -> None:
        told.append(unserved)
        raise BrokenPipeError("stderr is gone")

    worker.on_unserved = broken_stream
    assert worker.run_until_idle(install_signals=False) == 1
    assert told == [{"note": 1}, {"note": 1}]  # at the start and at the stop, each raising


# -- enqueue --job-timeout; --timeout belongs to --wait ------------------------------------------------


def test_enqueue_sets_a_jobs_timeout_with_job_timeout_and_refuses_timeout_without_wait(cli, tmp_path: Path) -> None:
    db = ("--db", f"sqlite:///{tmp_path / 'tether.db'}", "--root", str(tmp_path / "data"))
    assert cli(*db, "init")[0] == 0
    payload = '{"path": "a.json", "content": 1}'
    code, _, err = cli(*db, "enqueue", "create_file", "-p", payload, "--timeout", "3")
    assert code == 1 and err.strip() == (
        "tether: error: --timeout is how long --wait waits, and needs --wait; to limit how long the job "
        "may run, use --job-timeout"
    )
    code, _, err = cli(*db, "enqueue", "create_file", "-p", payload, "--job-timeout", "0")
    assert (code, err.strip()) == (1, "tether: error: --job-timeout: must be a number of seconds > 0, got 0")
    code, out, _ = cli(*db, "enqueue", "create_file", "-p", payload, "--job-timeout", "2.5", "--json", "-q")
    assert code == 0 and json.loads(out)["timeout"] == 2.5


# -- a PostgreSQL URL without the [postgres] extra -----------------------------------------------------

# psycopg made unimportable in a child process, as in an install without the extra: a finder ahead
# of every other refuses it.
_BLOCK_PSYCOPG = """
import sys
class NoPsycopg:
    def find_spec(self, name, path=None, target=None):
        if name == "psycopg" or name.startswith(("psycopg.", "psycopg_")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoPsycopg())
"""


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["jobs"],
        ["failed"],
        ["metrics"],
        ["init"],
        ["enqueue", "create_file", "-p", '{"path": "a.json", "content": 1}'],
        ["worker", "--until-idle"],
    ],
)
def test_a_postgresql_url_without_the_driver_is_one_line_naming_the_extra(command: list[str], tmp_path: Path) -> None:
    script = _BLOCK_PSYCOPG + "from tether.cli import main; sys.argv[0] = 'tether'; main()"
    db = "postgresql://app:pw@127.0.0.1:5432/app"
    proc = subprocess.run(
        [sys.executable, "-c", script, "--db", db, "--root", str(tmp_path), *command],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("TETHER_")},
    )
    lines = proc.stderr.strip().splitlines()  # status also prints its UNKNOWN line on stdout
    assert proc.returncode in (1, 3) and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and "pip install 'tether[postgres]'" in lines[0] and ":pw@" not in lines[0], lines
    assert len(proc.stdout.splitlines()) <= 1


def test_coordinator_open_without_the_driver_raises_one_config_error_naming_the_extra() -> None:
    script = _BLOCK_PSYCOPG + (
        "from tether import Coordinator\n"
        "from tether.errors import ConfigError\n"
        "try:\n"
        "    Coordinator.open('postgresql://app@127.0.0.1:5432/app')\n"
        "except ConfigError as e:\n"
        "    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "needs psycopg 3" in proc.stdout and "pip install 'tether[postgres]'" in proc.stdout


# -- the package's metadata ----------------------------------------------------------------------------


def test_the_package_declares_its_license_classifiers_and_ships_the_license_file() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().startswith("MIT License\n")
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in project["classifiers"])
    assert "README" in project["readme"]


def test_the_stand_in_assistant_runs_by_its_own_path_as_an_assistant_command(tmp_path: Path) -> None:
    """TETHER_ASSISTANT_COMMAND pointed at it runs it directly: its run bit and shebang must work."""
    stand_in = REPO / "sample_data" / "stand_in_claude.py"
    proc = subprocess.run(
        [str(stand_in), "-p", "--output-format", "json"], input='{"id": "REQ-1"}', capture_output=True, text=True
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["subtype"] == "success", proc.stderr
    mode = subprocess.run(
        ["git", "ls-files", "--stage", str(stand_in)], cwd=REPO, capture_output=True, text=True
    ).stdout
    assert mode.startswith("100755"), mode  # as a fresh clone checks it out
