"""`make demo` end to end: it runs from any working directory, leaves sample_data untouched, and
the data store and the ledger end as sample_data/README.md says."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from test_readme import BIN, BLOCKS, assert_same_output, block
from tether import TetherError
from tether.demo.walkthrough import DEFAULT_SAMPLE, MARKER, Demo

REPO = Path(__file__).resolve().parents[1]


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_demo_runs_end_to_end_from_a_fresh_directory(tmp_path):
    sample_before = tree_digest(REPO / "sample_data")
    proc = subprocess.run(
        [sys.executable, "-m", "tether.demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "REFUSED (InvalidModel), no job recorded" in out
    assert "DEDUPLICATED" in out
    assert "(attempt 1: simulated outage" in out
    # The AWS part, in the same ledger (its own moto server): drift made by hand in AWS is found
    # by the one reconcile, beside the files'.
    assert "checked 19 path(s)" in out and "drift found (4)" in out
    assert 'tags.project="hermes"' in out and "sqs_queue:us-east-1:apollo-jobs" in out
    assert "UNEXPECTED" not in out
    assert "reconcile exit codes: 0 (in sync), then 2 (drift found)" in out
    assert re.search(r"modified +people/alan.json", out) and re.search(r"missing +people/ada.json", out)
    # The README's walk-through is this output, ids, times and measured figures aside.
    [shown] = [text for kind, text in BLOCKS if text.startswith("tether demo: scratch directory")]
    assert_same_output(shown, out, "make demo's output")

    data = tmp_path / "demo-run" / "data"
    alan = orjson.loads((data / "people/alan.json").read_bytes())
    assert alan["email"] == "alan@example.org"
    assert alan["name"] == "A. M. Turing"  # damaged by hand, then found by reconcile
    assert not (data / "people/ada.json").exists()
    assert not (data / "people/ken.json").exists()
    assert not (data / "people/bob.json").exists()
    assert sorted(p.name for p in (data / "requirements/REQ-025").iterdir()) == ["README.md", "requirement.json"]
    assert orjson.loads((data / "projects/portal.json").read_bytes())["status"] == "archived"
    portal = [orjson.loads(p.read_bytes()) for p in data.glob("requirements/*/requirement.json")]
    assert sorted(r["status"] for r in portal if r["project"] == "portal") == ["archived"] * 8
    assert (data / "reports/billing.md").read_text().startswith("# Report: billing")
    extraction = orjson.loads((data / "requirements/REQ-001/extraction.json").read_bytes())
    assert extraction["requirement_id"] == "REQ-001"  # answered by the stand-in assistant

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'demo-run' / 'tether.db'}")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT type, status, attempts, parent_id, idempotency_key FROM tether_jobs")).all()
    engine.dispose()
    assert {r.status for r in rows} == {"completed"}
    heartbeats = [r for r in rows if (r.idempotency_key or "").startswith("schedule:heartbeat@")]
    assert len(heartbeats) >= 3 and re.search(
        r"heartbeat +│ \* \* \* \* \* \*", out
    )  # fired; tether schedules lists it
    rows = [r for r in rows if r not in heartbeats]
    assert len(heartbeats) == 3  # the schedule's limit: then it is finished
    assert len(rows) == 19 and sum(1 for r in rows if r.parent_id) == 8  # 3 of them the AWS part's
    assert sorted(r.type for r in rows if r.type == "sync_aws") == ["sync_aws"] * 2
    assert [r.attempts for r in rows if r.type == "publish_report"] == [2]  # one job despite two enqueues
    assert tree_digest(REPO / "sample_data") == sample_before
    after_the_demo(tmp_path)


def after_the_demo(work: Path) -> None:
    """The README's shell lines on the demo's ledger, run where the demo ran, as written."""
    shown = block("TETHER_IMPORT=tether.demo.app", "sh")
    script = shown.replace(".venv/bin/tether", str(BIN / "tether"))
    commands = [re.sub(r"\s+#.*$", "", line) for line in script.splitlines()]  # a comment would take the echo
    lines = [f'{line}; echo "<exit $?>"' if not line.startswith("export") else line for line in commands]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "AWS_"))}
    done = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=work, env=env, capture_output=True, text=True)
    assert re.findall(r"<exit (\d+)>", done.stdout) == ["0", "0", "2"], done.stdout + done.stderr
    report = done.stdout.split("<exit 0>")[-1]  # reconcile's: the two files damaged by hand, AWS left alone
    assert re.search(r"missing +people/ada.json", report) and re.search(r"modified +people/alan.json", report)
    assert len(re.findall(r"not_checked +(s3_bucket|sqs_queue):", report)) == 2 and "notes/hello.json" not in report


def test_demo_wipes_its_own_scratch_directory_on_every_run(tmp_path):
    lines: list[str] = []
    work = tmp_path / "scratch"
    Demo(work, DEFAULT_SAMPLE, lines.append).prepare()
    (work / "data" / "stray.json").write_text("{}")
    Demo(work, DEFAULT_SAMPLE, lines.append).prepare()
    assert (work / MARKER).exists()
    assert not (work / "data" / "stray.json").exists()
    assert tree_digest(work / "data") == tree_digest(DEFAULT_SAMPLE / "data")


def test_demo_refuses_to_wipe_a_directory_it_did_not_make(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep me")
    with pytest.raises(TetherError, match="was not made by the demo"):
        Demo(mine, DEFAULT_SAMPLE).prepare()
    assert (mine / "precious.txt").read_text() == "keep me"
    with pytest.raises(TetherError, match="must be outside"):
        Demo(DEFAULT_SAMPLE / "run", DEFAULT_SAMPLE).prepare()


def test_outbox_example_keeps_the_row_and_the_job_together(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "outbox.py"), "--dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rows in orders: ['o-1001']; jobs in tether_jobs: ['orders/o-1001.json']" in proc.stdout
    assert (tmp_path / "run" / "data" / "orders" / "o-1001.json").exists()
    assert not (tmp_path / "run" / "data" / "orders" / "o-1002.json").exists()


def test_readme_first_example_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (REPO / "README.md").read_text()
    first = re.search(r"```python\n(.*?)```", readme, re.S)
    assert first is not None
    code = first.group(1)
    assert "JsonStore" in code and len(code.strip().splitlines()) <= 12
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert "handle='ada' email='ada@example.org'" in capsys.readouterr().out
    assert (tmp_path / "data" / "people" / "ada.json").exists() and (tmp_path / "tether.db").exists()


def test_readme_job_type_example_runs_as_written(tmp_path):
    """The module and the script, saved under the names the README gives them and run with the
    commands it shows; importing the module (as every worker does) records nothing."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    [module] = [b for b in blocks if b.startswith("# stamps.py")]
    [script] = [b for b in blocks if b.startswith("# enqueue_stamp.py")]
    (tmp_path / "stamps.py").write_text(module)
    (tmp_path / "enqueue_stamp.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    run = functools.partial(subprocess.run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    enqueued = run([sys.executable, "enqueue_stamp.py"])
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.strip()
    worker = run([sys.executable, "-m", "tether", "--import", "stamps", "worker", "--until-idle", "-q"])
    assert worker.returncode == 0, worker.stderr
    assert (tmp_path / "data" / "stamps" / "a.txt").read_text() == "hello"
    listed = run([sys.executable, "-m", "tether", "--import", "stamps", "jobs", "--json"])
    assert [(j["id"], j["status"]) for j in json.loads(listed.stdout)["jobs"]] == [(job_id, "completed")]
