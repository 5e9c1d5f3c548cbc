"""``tether mcp``: the SDK's own client spawns the server over stdio and calls its tools. Read-only
unless ``--allow-actions``; each action does nothing without ``confirm`` and is logged as an
event; no tool's output carries a payload."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the mcp extra is part of the test extra")

from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.types import TextContent  # noqa: E402

from tether import Coordinator  # noqa: E402
from tether.jobtypes import CreateFile, default_registry  # noqa: E402
from tether.worker.retry import RetryPolicy  # noqa: E402

SECRET = "s3cr3t-payload-text"
READS = {"status", "outstanding", "failed", "stuck", "job", "history", "drift", "spend"}
ACTIONS = {"retry", "cancel", "repair_apply"}


def call_all(db: str, root: Path, calls: list[tuple[str, dict[str, Any]]], *flags: str) -> tuple[set[str], list[Any]]:
    """The tool names the server lists and the answer to each call, through a `tether mcp`
    subprocess spoken to by the SDK's client; its stderr (events) goes to ``root``/../stderr."""
    tether = str(Path(sys.executable).with_name("tether"))
    params = StdioServerParameters(
        command=tether, args=["--db", db, "--root", str(root), "mcp", *flags], env=dict(os.environ)
    )

    async def session() -> tuple[set[str], list[Any]]:
        with open(root.parent / "stderr", "a") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                names = {t.name for t in (await s.list_tools()).tools}
                answers = []
                for name, arguments in calls:
                    result = await s.call_tool(name, arguments)
                    content = result.content[0]
                    assert isinstance(content, TextContent)
                    answers.append(json.loads(content.text))
                return names, answers

    return asyncio.run(asyncio.wait_for(session(), 60))


@pytest.fixture
def ledger(tmp_path):
    """A ledger with a completed job, a failed one and a pending one, each payload holding SECRET,
    and a reconcile run that found one file modified."""
    from jobkit import Note, NoteType

    registry = default_registry()
    registry.register(NoteType())
    db = f"sqlite:///{tmp_path / 'tether.db'}"
    with Coordinator.open(db, root=tmp_path / "data", registry=registry) as c:
        done = c.enqueue(CreateFile(path="a.json", content={"k": SECRET})).id
        c.run_until_idle()
        failed = c.enqueue(Note(name="bad", fail_times=9, permanent=True), meta={"why": "test"}).id
        c.run_until_idle(retry=RetryPolicy(base=0.0))
        pending = c.enqueue(CreateFile(path="b.json", content={"k": SECRET}), delay=3600).id
        (c.root / "a.json").write_text("edited by hand")
        c.startup_check()
    return db, tmp_path / "data", {"done": done, "failed": failed, "pending": pending}


def test_the_read_only_server_answers_every_question_and_never_shows_a_payload(ledger):
    db, root, ids = ledger
    calls = [
        ("status", {}),
        ("outstanding", {}),
        ("failed", {}),
        ("stuck", {}),
        ("job", {"job_id": ids["done"]}),
        ("history", {"target": "a.json"}),
        ("drift", {}),
        ("spend", {"hours": 24}),
        ("job", {"job_id": "NOSUCHJOB"}),
    ]
    names, (status, outstanding, failed, stuck, job, history, drift, spend, missing) = call_all(db, root, calls)
    assert names == READS  # no action without --allow-actions
    assert status["verdict"] in ("ok", "warning", "error")
    assert outstanding["pending"] == 1
    [group] = failed["groups"]
    assert group["count"] == 1 and group["newest_id"] == ids["failed"] and "can never work" in group["error"]
    assert stuck["jobs"] == []
    assert job["id"] == ids["done"] and job["status"] == "completed" and "payload" not in job
    assert [e["job_id"] for e in history["entries"]][0] == ids["done"]
    assert drift["exit_code"] == 2 and "modified" in [f["status"] for f in drift["findings"]]
    assert spend["cost_usd"] == 0
    assert "NOSUCHJOB" in missing["error"]
    everything = json.dumps([status, outstanding, failed, stuck, job, history, drift, spend])
    assert SECRET not in everything


def test_actions_need_the_flag_and_a_confirm_and_each_is_logged(ledger):
    db, root, ids = ledger
    calls = [
        ("retry", {"job_id": ids["failed"]}),
        ("retry", {"job_id": ids["failed"], "confirm": True}),
        ("cancel", {"job_id": ids["pending"], "confirm": True}),
        ("repair_apply", {"confirm": False}),
        ("repair_apply", {"confirm": True}),
    ]
    names, (unconfirmed, retried, cancelled, unconfirmed_repair, repaired) = call_all(
        db, root, calls, "--allow-actions"
    )
    assert names == READS | ACTIONS
    assert unconfirmed["done"] is False and "confirm=true" in unconfirmed["reason"]
    assert unconfirmed_repair["done"] is False
    assert retried["done"] and retried["status"] == "pending"
    assert cancelled["done"] and cancelled["outcome"] == "cancelled"
    assert repaired["done"] and repaired["enqueued"] == 1
    with Coordinator.open(db, root=root) as c:
        assert c.get(ids["failed"]).status.value == "pending"
        assert c.get(ids["pending"]).status.value == "cancelled"
    logged = [json.loads(line) for line in (root.parent / "stderr").read_text().splitlines() if line.startswith("{")]
    actions = [e["action"] for e in logged if e.get("event") == "mcp_action"]
    assert actions == ["retry", "cancel", "repair_apply"]  # only what was done


def test_without_the_flag_an_action_is_no_tool(ledger):
    db, root, ids = ledger
    names, _ = call_all(db, root, [])
    assert not names & ACTIONS


def test_without_the_extra_tether_mcp_says_how_to_install_it_in_one_line(tmp_path):
    import subprocess

    with Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data"):
        pass
    script = (
        "import sys; sys.modules['mcp'] = None\n"  # as if not installed
        "from tether.cli import main\n"
        f"sys.argv = ['tether', '--db', 'sqlite:///{tmp_path / 'tether.db'}', 'mcp']\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode != 0
    assert "pip install 'tether[mcp]'" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
