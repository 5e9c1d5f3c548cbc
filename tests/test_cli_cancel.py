"""``tether cancel``, ``pause`` and ``resume`` through the real entry point, on both ledgers: what
they print, their exit codes, and that ``status`` and ``jobs`` show a paused type with its backlog
and raise no "unclaimed" warning for it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import test_cli
from test_cli import Run
from tether import Coordinator, FakeClock, SystemClock
from tether.jobtypes import CreateFile
from tether.ledger.status import JobStatus
from workerkit import wait_for

# test_cli's fixtures: ``tether`` runs the real entry point on the test's ledger.
db = test_cli.db
tether = test_cli.tether


def test_cancel_of_a_pending_job_prints_it_cancelled(coordinator: Coordinator, tether: Callable[..., Run]):
    job_id = coordinator.enqueue(CreateFile(path="a.json", content=1)).id
    r = tether("cancel", job_id, "--reason", "wrong file")
    assert r.code == 0, r.err
    assert job_id in r.out and "cancelled" in r.out
    assert coordinator.get(job_id).status is JobStatus.CANCELLED


def test_cancel_of_a_finished_job_is_refused_with_one_line_and_exit_1(
    coordinator: Coordinator, tether: Callable[..., Run]
):
    job_id = coordinator.enqueue(CreateFile(path="a.json", content=1)).id
    coordinator.run_until_idle()
    r = tether("cancel", job_id)
    assert r.code == 1
    assert r.err == f"tether: error: job {job_id} is completed; only a pending or running job can be cancelled\n"
    assert r.out == ""


def test_cancel_by_tag_cancels_the_jobs_carrying_it(coordinator: Coordinator, tether: Callable[..., Run]):
    tagged = coordinator.enqueue(CreateFile(path="a.json", content=1), tags=["tenant:acme"]).id
    other = coordinator.enqueue(CreateFile(path="b.json", content=1)).id
    r = tether("cancel", "--tag", "tenant:acme")
    assert r.code == 0, r.err
    assert tagged in r.out and other not in r.out
    assert coordinator.get(tagged).status is JobStatus.CANCELLED and coordinator.get(other).status is JobStatus.PENDING


def test_cancel_with_ids_and_a_type_together_is_one_line_and_exit_1(tether: Callable[..., Run], coordinator):
    r = tether("cancel", "01ABC", "--type", "create_file")
    assert (r.code, r.err) == (
        1,
        "tether: error: cancel: give job ids, or a type, a key and/or a tag (not both, not neither)\n",
    )


def test_cancel_json_lists_each_job_with_its_outcome(coordinator: Coordinator, tether: Callable[..., Run]):
    a = coordinator.enqueue(CreateFile(path="a.json", content=1)).id
    b = coordinator.enqueue(CreateFile(path="b.json", content=1)).id
    r = tether("cancel", "--type", "create_file", "--json")
    assert r.code == 0
    assert r.json() == {
        "cancelled": [
            {"id": a, "outcome": "cancelled", "effect": None, "type": "create_file"},
            {"id": b, "outcome": "cancelled", "effect": None, "type": "create_file"},
        ],
        "errors": [],
    }


def test_a_paused_type_is_shown_with_its_backlog_and_raises_no_unclaimed_warning(
    make_coordinator: Callable[..., Coordinator], clock: FakeClock, tether: Callable[..., Run]
):
    c = make_coordinator()
    clock.set(SystemClock().now() - timedelta(seconds=600))  # waiting past the unclaimed grace (300 s)
    c.enqueue(CreateFile(path="a.json", content=1))
    c.enqueue(CreateFile(path="b.json", content=1))
    clock.set(SystemClock().now())
    before = tether("status", "--json").json()
    assert (before["verdict"], before["reasons"][0][:21]) == ("warning", "unclaimed:create_file")
    r = tether("pause", "create_file", "--reason", "disk swap")
    assert r.code == 0 and "create_file paused" in r.out
    status = tether("status", "--json").json()
    assert status["verdict"] == "ok", status["reasons"]
    assert [p["type"] for p in status["paused"]] == ["create_file"]
    assert [(b["type"], b["pending"], b["paused"]) for b in status["by_type"]] == [("create_file", 2, True)]
    text = tether("status").out
    assert "paused: create_file since" in text and "disk swap" in text and "create_file (paused)" in text
    listed = tether("jobs", "--json").json()
    assert [(p["type"], p["pending"], p["reason"]) for p in listed["paused"]] == [("create_file", 2, "disk swap")]
    assert "paused: create_file (2 pending, not claimed): disk swap" in tether("jobs").out
    assert c.run_until_idle() == 0  # no worker claims it
    assert tether("resume", "create_file").out == "create_file resumed\n"
    assert tether("status", "--json").json()["paused"] == []
    # Another process resumed it: this one's workers see that within pausing.REFRESH.
    wait_for(lambda: c.run_until_idle() and c.stats().pending == 0, "the resumed type's jobs to run", timeout=5)
    assert tether("resume", "create_file").out == "create_file was not paused\n"
