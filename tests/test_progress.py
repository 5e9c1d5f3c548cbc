"""A running handler reports progress: kept on the job (throttled), shown by jobs, show and --json."""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest

from tether import JobContext, JobType, Payload
from tether.jobtypes import default_registry


class Copy(Payload):
    job_type: ClassVar[str] = "copy"
    files: int


class CopyType(JobType[Copy]):
    """Reports progress per file; waits between files until the test lets it go on."""

    name = "copy"
    payload_model = Copy

    def __init__(self) -> None:
        self.step = threading.Semaphore(0)
        self.reported = threading.Event()

    def run(self, payload: Copy, ctx: JobContext) -> None:
        for n in range(1, payload.files + 1):
            assert self.step.acquire(timeout=10)
            ctx.progress(n, payload.files, note="copying")
            self.reported.set()
        assert self.step.acquire(timeout=10)  # and once more to finish


@pytest.fixture
def copying(make_coordinator, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("tether.jobtypes.context.time.monotonic", lambda: now[0])
    copy = CopyType()
    registry = default_registry()
    registry.register(copy)
    return make_coordinator(registry=registry), copy, now


def test_progress_is_written_at_most_once_a_second_and_never_in_the_first(copying):
    c, copy, now = copying
    job_id = c.enqueue(Copy(files=3)).id
    runner = threading.Thread(target=c.run_until_idle)
    runner.start()
    try:
        copy.step.release()  # file 1, within the job's first second: not written
        assert copy.reported.wait(10)
        copy.reported.clear()
        assert c.get(job_id).progress is None
        now[0] += 1.5
        copy.step.release()  # file 2, 1.5 s in: written
        assert copy.reported.wait(10)
        copy.reported.clear()
        assert c.get(job_id).to_dict()["progress"]["done"] == 2
        now[0] += 0.5
        copy.step.release()  # file 3, half a second after the last write: not written
        assert copy.reported.wait(10)
        assert c.get(job_id).to_dict()["progress"]["done"] == 2
    finally:
        copy.step.release(5)
        runner.join(10)
    progress = c.get(job_id).to_dict()["progress"]
    assert progress["done"] == 2 and progress["total"] == 3 and progress["note"] == "copying"


def test_jobs_and_show_display_a_running_jobs_progress(copying, tmp_path, db_url, root):
    from typer.testing import CliRunner

    from tether.cli import app

    c, copy, now = copying
    job_id = c.enqueue(Copy(files=2)).id
    runner = threading.Thread(target=c.run_until_idle)
    runner.start()
    try:
        copy.step.release()
        assert copy.reported.wait(10)
        copy.reported.clear()
        now[0] += 2
        copy.step.release()
        assert copy.reported.wait(10)
        cli = CliRunner()
        listed = cli.invoke(app, ["--db", db_url, "jobs", "--status", "claimed"], terminal_width=200)
        shown = cli.invoke(app, ["--db", db_url, "show", job_id], terminal_width=200)
    finally:
        copy.step.release(5)
        runner.join(10)
    assert "2/2 (100%) copying" in listed.output, listed.output
    assert "2/2 (100%) copying" in shown.output, shown.output
