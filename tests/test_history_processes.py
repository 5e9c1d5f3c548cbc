"""A target's history after real ``tether worker`` processes ran its job through two errors, a
timeout and a worker SIGKILLed mid-run before it completed: every attempt is told, in order, with
its outcome, through the CLI (SQLite and PostgreSQL)."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import pytest

from clikit import run_main
from tether import Coordinator, JobStatus
from tether.jobtypes import default_registry
from workerkit import pj, start_worker, wait_for

pytestmark = pytest.mark.slow

PROC_TYPES = "tests.proc_jobtypes"


def test_history_tells_each_attempt_of_a_job_that_erred_twice_timed_out_and_outlived_a_killed_worker(
    db_url: str, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = default_registry()
    pj.register(registry)
    script = ["error", "error", "hang", "die", "ok"]
    with Coordinator.open(db_url, root=root, registry=registry) as c:
        job_id = c.enqueue(pj.Scripted(path="notes/a.json", script=script), max_attempts=5, timeout=0.5).job.id

        fast = {pj.FAST_RETRY_ENV: "0.05"}
        doomed = start_worker(db_url, root, tmp_path / "w1.out", "--poll-interval", "0.05", env=fast, module=PROC_TYPES)
        assert doomed.wait() == -signal.SIGKILL  # the fourth attempt killed its own worker mid-run
        held = c.get(job_id)
        assert (held.status, held.attempts, held.locked_by) == (
            JobStatus.CLAIMED,
            4,
            doomed.events("claimed")[-1]["worker"],
        )

        survivor = start_worker(
            db_url, root, tmp_path / "w2.out", "--lock-timeout", "1", "--poll-interval", "0.05", module=PROC_TYPES
        )
        try:
            wait_for(lambda: c.get(job_id).status is JobStatus.COMPLETED, "the survivor to reclaim and complete it")
        finally:
            survivor.popen.send_signal(signal.SIGTERM)
        assert survivor.wait() == 0

    code, text = run_main(monkeypatch, capsys, "--db", db_url, "history", "notes/a.json", "--json")
    assert code == 0, text
    entries = orjson.loads(text)["entries"]
    first, second = doomed.events("claimed")[0]["worker"], survivor.events("claimed")[0]["worker"]
    assert [(e["kind"], e["attempt"], e["outcome"], e["worker"]) for e in entries] == [
        ("enqueued", None, None, None),
        ("attempt", 1, "error", first),
        ("attempt", 2, "error", first),
        ("attempt", 3, "timeout", first),
        ("attempt", 4, "reclaimed", first),
        ("attempt", 5, "completed", second),
    ]
    assert [e["detail"] for e in entries[1:3]] == [
        "RuntimeError: scripted error on attempt 1",
        "RuntimeError: scripted error on attempt 2",
    ]
    assert entries[3]["detail"].startswith("JobTimedOut:")
    assert entries[4]["detail"].startswith("worker died while running")
    starts = [e["at"] for e in entries[1:]]
    assert starts == sorted(starts) and all(e["ended_at"] for e in entries[1:])

    code, text = run_main(monkeypatch, capsys, "--db", db_url, "history", "notes/a.json")
    assert code == 0, text
    events = [line.split("│")[4].strip() for line in text.splitlines() if job_id in line]
    assert events == ["enqueued", "error", "error", "timeout", "reclaimed", "completed"]
