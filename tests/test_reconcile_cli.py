"""``bin/tether-reconcile-check`` and ``tether reconcile`` as a new user runs them: from another directory,
with flags or environment variables, exit 0 in sync / 2 drift / 1 could not check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from clikit import run_split
from tether import Coordinator, CreateFile, DeleteFile

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "bin" / "tether-reconcile-check"


@pytest.fixture
def site(tmp_path: Path) -> dict[str, str]:
    """A ledger and data root built by real jobs, and an unrelated working directory."""
    db = f"sqlite:///{tmp_path / 'var' / 'tether.db'}"
    root = tmp_path / "var" / "data"
    with Coordinator.open(db, root=root) as c:
        c.enqueue(CreateFile(path="people/ada.json", content={"name": "Ada"}))
        c.enqueue(CreateFile(path="people/ken.json", content={"name": "Ken"}))
        c.enqueue(CreateFile(path="old.json", content=1))
        c.run_until_idle()
        c.enqueue(DeleteFile(path="old.json"))
        c.run_until_idle()
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    return {"db": db, "root": str(root), "cwd": str(elsewhere)}


def run(args: list[str], cwd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return subprocess.run(
        [str(CHECK), *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=60
    )


def test_check_exits_0_when_in_sync_from_another_directory(site: dict[str, str]) -> None:
    done = run(["--db", site["db"], "--root", site["root"]], site["cwd"])
    assert done.returncode == 0, done.stderr
    assert "in sync" in done.stdout and "3 in_sync" in done.stdout
    assert not list(Path(site["cwd"]).iterdir()), "the check created nothing in the working directory"


def test_check_exits_2_on_drift_and_names_the_path(site: dict[str, str]) -> None:
    Path(site["root"], "people", "ada.json").unlink()
    Path(site["root"], "old.json").write_text("back")
    done = run(["--db", site["db"], "--root", site["root"], "--json"], site["cwd"])
    assert done.returncode == 2, done.stderr
    report = orjson.loads(done.stdout)
    assert {(f["path"], f["status"]) for f in report["findings"]} == {
        ("people/ada.json", "missing"),
        ("old.json", "unexpected"),
    }
    events = [orjson.loads(line) for line in done.stderr.splitlines()]
    drift = [e for e in events if e["event"] == "drift_detected"]
    assert {e["path"] for e in drift} == {"people/ada.json", "old.json"}
    assert all("content" not in e and "Ada" not in str(e) for e in drift), "never file contents"


def test_check_reads_the_database_and_root_from_the_environment(site: dict[str, str]) -> None:
    env = {"TETHER_DB": site["db"], "TETHER_ROOT": site["root"]}
    assert run(["--quiet"], site["cwd"], env).returncode == 0
    Path(site["root"], "people", "ken.json").write_text('{"name": "Kenneth"}')
    assert run(["--quiet"], site["cwd"], env).returncode == 2


@pytest.mark.parametrize(
    "case",
    [
        "unreachable database",
        "root is a file",
        "unknown flag",
        "no such python",
        "mistyped database path",
        "mistyped root",
    ],
)
def test_check_exits_1_when_it_cannot_check_never_2(site: dict[str, str], tmp_path: Path, case: str) -> None:
    args, env = ["--db", site["db"], "--root", site["root"]], {}
    if case == "unreachable database":
        args = ["--db", "postgresql://nobody@127.0.0.1:9/none", "--root", site["root"]]
    elif case == "root is a file":
        (tmp_path / "file").write_text("x")
        args = ["--db", site["db"], "--root", str(tmp_path / "file")]
    elif case == "mistyped database path":  # never a new empty ledger that reads "in sync"
        args = ["--db", f"sqlite:///{tmp_path / 'typo' / 'tether.db'}", "--root", site["root"]]
    elif case == "mistyped root":  # never a new empty root that reads "missing"
        args = ["--db", site["db"], "--root", str(tmp_path / "typo-root")]
    elif case == "unknown flag":
        args.append("--no-such-flag")
    else:
        env = {"TETHER_PYTHON": str(tmp_path / "missing-python")}
    done = run(args, site["cwd"], env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip(), "says why"
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "typo-root").exists()  # nothing created


def invoke(args: list[str], env: dict[str, str]):
    """``tether`` in this process (each subprocess pays ~3 s of imports on this machine)."""
    from typer.testing import CliRunner

    from tether.cli import app

    return CliRunner().invoke(app, args, env=env, catch_exceptions=False)


def test_tether_reconcile_prints_a_table_by_default_and_json_without_a_progress_bar(site: dict[str, str]) -> None:
    env = {"TETHER_DB": site["db"], "TETHER_ROOT": site["root"]}
    table = invoke(["reconcile", "--quiet"], env)
    assert table.exit_code == 0 and table.stderr == ""
    assert table.stdout.splitlines()[0].startswith("checked 3 path(s)")
    as_json = invoke(["reconcile", "--json", "--quiet"], env)
    assert as_json.exit_code == 0 and as_json.stderr == "", "no progress bar when not on a terminal"
    report = orjson.loads(as_json.stdout)
    assert report["exit_code"] == 0 and report["counts"]["in_sync"] == 3 and report["newest_job_id"]
    Path(site["root"], "people", "ada.json").unlink()
    assert invoke(["reconcile", "--quiet"], env).exit_code == 2


def test_tether_reconcile_crash_exits_1_not_2(site: dict[str, str]) -> None:
    env = {"TETHER_DB": site["db"], "TETHER_ROOT": site["root"], "TETHER_IMPORT": "no_such_module_here"}
    done = invoke(["reconcile"], env)
    assert done.exit_code == 1 and "Traceback" not in done.stderr
    # One line, prefixed as every command's error is.
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("tether: error: could not check: ") and "no_such_module_here" in line, line


def test_tether_reconcile_startup_reclaims_a_dead_workers_lock_and_reports_its_path_in_flight(
    site: dict[str, str],
) -> None:
    import sqlalchemy as sa

    with Coordinator.open(site["db"], root=site["root"]) as c:
        job = c.enqueue(CreateFile(path="people/ada.json", content={"name": "Ada L."}, overwrite=True)).id
        assert [j.id for j in c.queue.claim("dead-worker")] == [job]
        with c.engine.begin() as conn:  # its last heartbeat, long ago
            conn.execute(
                sa.text("UPDATE tether_jobs SET locked_at = '2000-01-01 00:00:00.000000' WHERE id = :id"), {"id": job}
            )
    env = {"TETHER_DB": site["db"], "TETHER_ROOT": site["root"]}
    done = invoke(["reconcile", "--startup", "--json", "--quiet"], env)
    assert done.exit_code == 0, done.stdout
    report = orjson.loads(done.stdout)
    assert [(f["path"], f["status"], f["job_id"]) for f in report["findings"]] == [
        ("people/ada.json", "not_checked", job)
    ]
    with Coordinator.open(site["db"], root=site["root"]) as c:
        assert c.get(job).status.value == "pending"


def test_a_modified_file_reports_its_differing_fields_and_every_finding_field_is_documented(
    site: dict[str, str],
) -> None:
    Path(site["root"], "people", "ken.json").write_text('{"name": "Kenneth Thompson"}\n')
    done = run(["--db", site["db"], "--root", site["root"], "--json"], site["cwd"])
    assert done.returncode == 2, done.stderr
    report = orjson.loads(done.stdout)
    [finding] = report["findings"]
    assert finding["status"] == "modified" and finding["path"] == "people/ken.json"
    assert finding["expected"]["size"] == finding["expected_size"] and finding["actual"]["size"] == 29
    assert [d["path"] for d in finding["differences"]] == ["size"]  # the bytes are hashed only when sizes agree
    assert all(d["kind"] == "NOT_EQUAL" for d in finding["differences"])
    doc = (REPO / "docs" / "cli-json.md").read_text()
    section = doc.split("## `tether reconcile --json`")[1].split("\n## ")[0]
    assert [f for f in [*report, *finding] if f"`{f}`" not in section and f'"{f}"' not in section] == []


STAMPS = """
from typing import ClassVar
from tether import JobType, Payload
from tether.jobtypes.target import Target

class Stamp(Payload):
    job_type: ClassVar[str] = "stamp"
    path: str

class StampType(JobType[Stamp]):
    name = "stamp"
    payload_model = Stamp

    def target(self, p):
        return Target.file(p.path)

    def run(self, p, ctx):
        (ctx.root / p.path).write_text("stamped")

def register(registry):
    registry.register(StampType())
"""


def test_a_type_without_a_probe_is_reported_not_checked_never_in_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process (clikit.run_split): what is under test is the report, not a process start.
    (tmp_path / "stamps.py").write_text(STAMPS)
    for name in ("TETHER_DB", "TETHER_ROOT", "TETHER_IMPORT", "TETHER_SCHEMA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "stamps", raising=False)
    db, root = f"sqlite:///{tmp_path / 'tether.db'}", tmp_path / "data"
    tether = ["--db", db, "--root", str(root), "--import", "stamps"]
    assert run_split(monkeypatch, capsys, *tether, "init")[0] == 0
    assert run_split(monkeypatch, capsys, *tether, "enqueue", "stamp", "--payload", '{"path": "a.txt"}')[0] == 0
    assert run_split(monkeypatch, capsys, *tether, "worker", "--until-idle", "-q")[0] == 0
    (root / "a.txt").unlink()  # the effect is gone, and nothing can tell
    _, out, _ = run_split(monkeypatch, capsys, *tether, "reconcile", "--quiet")
    assert "not_checked" in out and "type 'stamp' has no probe" in out
    assert "in sync where checked; 1 not checked" in out
    assert "\nin sync\n" not in out


def test_full_reads_every_file_and_refuses_to_go_with_exists_only(site: dict[str, str]) -> None:
    done = run(["--db", site["db"], "--root", site["root"], "--full"], site["cwd"])
    assert done.returncode == 0, done.stderr
    assert "content, every file read" in done.stdout and "3 in_sync" in done.stdout
    both = run(["--db", site["db"], "--root", site["root"], "--full", "--exists-only"], site["cwd"])
    assert both.returncode == 1
    assert both.stderr.count("\n") == 1 and "--full reads every file and --exists-only reads none" in both.stderr
