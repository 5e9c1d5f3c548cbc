"""An operator's cancel across processes, on SQLite and PostgreSQL: a ``tether worker`` process
runs the jobs, and ``tether cancel`` (another process) cancels them while they run: a create_file
batch mid-drain, a claude_extraction whose stand-in assistant sleeps (its whole process group is
gone within 2 s, the job cancelled with ``effect: absent``), and a handler that already wrote its
file (``effect: landed``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from proc_cancel import SlowWrite
from test_claude_extraction import STAND_IN, payload, wait_gone
from tether import Coordinator
from tether.jobtypes import CreateFile, default_registry
from tether.ledger.status import JobStatus
from workerkit import REPO, TETHER, wait_for


def registry():
    from proc_cancel import register

    r = default_registry()
    register(r)
    return r


def worker(db: str, root: Path, out: Path, **env: str) -> subprocess.Popen[bytes]:
    """``tether worker`` with the cancel tests' job type, its events in ``out``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "CLAUDE_STANDIN_"))}
    full["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO / "src")])
    full.update(env)
    argv = [*TETHER, "--db", db, "--root", str(root), "--import", "proc_cancel", "worker", "--poll-interval", "0.1"]
    with open(out, "ab") as f:
        return subprocess.Popen(argv, cwd=REPO, env=full, stdout=f, stderr=subprocess.STDOUT)


def cancel(db: str, *args: str) -> dict:
    """``tether cancel ARGS --json`` in a process of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO / "src")])
    run = subprocess.run(
        [*TETHER, "--db", db, "--import", "proc_cancel", "cancel", *args, "--json"],
        cwd=REPO, env=env, capture_output=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()
    return json.loads(run.stdout)


@pytest.fixture
def ledger(db_url: str, root: Path) -> str:
    Coordinator.open(db_url, root=root, registry=registry()).close()
    return db_url


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_a_create_file_batch_cancelled_mid_drain_ends_each_job_completed_or_cancelled_as_its_file_says(
    ledger: str, root: Path, tmp_path: Path
):
    with Coordinator.open(ledger, root=root, registry=registry()) as c:
        ids = [r.id for r in c.enqueue_many([CreateFile(path=f"b/{n}.json", content=n) for n in range(3000)])]
        proc = worker(ledger, root, tmp_path / "worker.out")
        try:
            wait_for(lambda: c.stats().pending < 2900, "the worker to be draining")
            result = cancel(ledger, "--type", "create_file", "--wait", "10")
            assert not [r for r in result["cancelled"] if r["outcome"] == "requested"], result
            wait_for(lambda: c.stats().outstanding == 0, "every job to end")
        finally:
            stop(proc)
        jobs = {j.id: j for j in (c.get(i) for i in ids)}
    by_status = {s: [j for j in jobs.values() if j.status is s] for s in JobStatus}
    assert by_status[JobStatus.COMPLETED] and by_status[JobStatus.CANCELLED], {s: len(v) for s, v in by_status.items()}
    assert len(by_status[JobStatus.COMPLETED]) + len(by_status[JobStatus.CANCELLED]) == 3000
    for job in by_status[JobStatus.COMPLETED]:
        assert (root / job.payload_data["path"]).exists()
    for job in by_status[JobStatus.CANCELLED]:
        effect = orjson.loads(job.result)["effect"] if job.result else None
        exists = (root / job.payload_data["path"]).exists()
        assert effect in (None, "absent", "landed"), job
        assert exists == (effect == "landed"), (job.id, effect, exists)
    print(
        f"\n{len(by_status[JobStatus.COMPLETED])} completed, {len(by_status[JobStatus.CANCELLED])} cancelled "
        f"({sum(1 for j in by_status[JobStatus.CANCELLED] if j.result)} while claimed)"
    )


def test_a_running_extraction_is_cancelled_its_process_group_gone_within_2s_effect_absent(
    ledger: str, root: Path, tmp_path: Path
):
    with Coordinator.open(ledger, root=root) as c:
        job_id = c.enqueue(payload()).id
    calls, grandchild = tmp_path / "calls", tmp_path / "grandchild.pid"
    proc = worker(
        ledger, root, tmp_path / "worker.out",
        TETHER_ASSISTANT_COMMAND=f"{sys.executable} {STAND_IN}",
        CLAUDE_STANDIN_LOG=str(calls), CLAUDE_STANDIN_GRANDCHILD=str(grandchild),
    )  # fmt: skip
    try:
        wait_for(lambda: calls.exists() and grandchild.exists() and grandchild.read_text().strip(), "the stand-in")
        assistant, child = int(calls.read_text().split()[2]), int(grandchild.read_text())
        with Coordinator.open(ledger, root=root) as operator:  # the test's process, not the worker's
            [result] = operator.cancel(job_id, reason="prompt was wrong")
        requested = time.monotonic()  # the request is committed when cancel returns
        assert result.outcome == "requested"
        left = wait_gone([assistant, child], timeout=2.0)
        gone_after = time.monotonic() - requested
        assert left == [], f"still running {gone_after:.2f}s after the cancel: {left}"
        with Coordinator.open(ledger, root=root) as c:
            wait_for(lambda: c.get(job_id).status is JobStatus.CANCELLED, "the cancel to be recorded", timeout=10)
            job = c.get(job_id)
    finally:
        stop(proc)
    assert orjson.loads(job.result or "null") == {"effect": "absent"}
    assert job.last_error == "Cancelled: prompt was wrong (effect: absent)"
    assert not (root / "requirements").exists() or not any((root / "requirements").rglob("*.json"))
    print(f"\nprocess group gone {gone_after:.2f}s after the cancel was requested")


def test_a_running_handler_that_already_wrote_its_file_is_cancelled_with_effect_landed(
    ledger: str, root: Path, tmp_path: Path
):
    started = tmp_path / "started"
    with Coordinator.open(ledger, root=root, registry=registry()) as c:
        job_id = c.enqueue(SlowWrite(path="w.json", content=1, write_first=True, started=str(started))).id
        proc = worker(ledger, root, tmp_path / "worker.out")
        try:
            wait_for(lambda: started.exists() and job_id in started.read_text(), "the handler to write and wait")
            [result] = c.cancel(job_id)  # from the test's process, not the worker's
            requested = time.monotonic()
            wait_for(lambda: c.get(job_id).status is JobStatus.CANCELLED, "the cancel to be recorded", timeout=10)
            took = time.monotonic() - requested
        finally:
            stop(proc)
        job = c.get(job_id)
    assert result.outcome == "requested"
    assert orjson.loads(job.result or "null") == {"effect": "landed"}
    assert took < 1.5, f"the worker recorded the cancel {took:.2f}s after it was requested"
    assert job.status is JobStatus.CANCELLED and (root / "w.json").exists()
    print(f"\ncancel recorded {took:.2f}s after the request was committed")


def test_workers_process_reports_the_cancel_it_saw(ledger: str, root: Path, tmp_path: Path):
    started, out = tmp_path / "started", tmp_path / "worker.out"
    with Coordinator.open(ledger, root=root, registry=registry()) as c:
        job_id = c.enqueue(SlowWrite(path="e.json", content=1, started=str(started))).id
        proc = worker(ledger, root, out)
        try:
            wait_for(lambda: started.exists() and job_id in started.read_text(), "the handler to wait")
            cancel(ledger, job_id, "--wait", "10")
        finally:
            stop(proc)
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    seen = [e for e in lines if e["event"] == "cancel_seen"]
    ended = [e for e in lines if e["event"] == "cancelled_running"]
    assert [e["job_id"] for e in seen] == [job_id] and [e["job_id"] for e in ended] == [job_id]
