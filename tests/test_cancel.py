"""An operator's cancel, in-process on both ledgers: a pending job is cancelled at once and the
next job on its target may run; a running job's worker sees the cancel, stops the handler and
records the job ``cancelled`` with its probe's verdict on the effect; its follow-up jobs never
commit; a finished job is refused."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from jobkit import registry_with
from proc_cancel import SlowWrite, SlowWriteType
from tether import Coordinator
from tether.errors import InvalidTransition, JobNotFound
from tether.jobtypes import CreateFile
from tether.ledger.status import JobStatus
from tether.worker.loop import Worker
from workerkit import wait_for


@pytest.fixture
def c(make_coordinator: Callable[..., Coordinator]) -> Coordinator:
    return make_coordinator(registry_with(SlowWriteType()))


@pytest.fixture
def running(c: Coordinator) -> Iterator[Worker]:
    """A worker running in a thread of this process (its supervisor watches for cancels)."""
    worker = c.worker(poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    yield worker
    worker.stop(cancel=True)
    thread.join(timeout=30)


def started(path: Path, job_id: str) -> bool:
    return path.exists() and job_id in path.read_text()


def test_a_pending_job_is_cancelled_and_the_next_job_on_its_target_runs(c: Coordinator):
    first = c.enqueue(CreateFile(path="t/a.json", content=1)).id
    second = c.enqueue(CreateFile(path="t/a.json", content=2)).id
    [result] = c.cancel(first, reason="wrong content")
    assert result.outcome == "cancelled" and result.job is not None and result.job.status is JobStatus.CANCELLED
    assert c.get(first).last_error == "Cancelled: wrong content"
    # The next job on the target is claimable at once (unblocked in the cancel's transaction).
    assert [j.id for j in c.queue.claim("w")] == [second]


def test_cancel_by_type_and_by_key_takes_only_the_active_jobs_chosen(c: Coordinator):
    keyed = c.enqueue(CreateFile(path="k.json", content=1), key="tenant-a").id
    other = c.enqueue(CreateFile(path="o.json", content=1)).id
    slow = c.enqueue(SlowWrite(path="s.json", content=1)).id
    assert [r.job_id for r in c.cancel(key="tenant-a")] == [keyed]
    assert c.get(other).status is JobStatus.PENDING
    assert [r.job_id for r in c.cancel(job_type="slow_write")] == [slow]
    assert c.get(other).status is JobStatus.PENDING


def test_cancel_by_tag_takes_only_the_active_jobs_carrying_it(c: Coordinator):
    tagged = [c.enqueue(CreateFile(path=f"t{i}.json", content=i), tags=["tenant:acme"]).id for i in range(2)]
    other = c.enqueue(CreateFile(path="o.json", content=1), tags=["tenant:other"]).id
    assert sorted(r.job_id for r in c.cancel(tag="tenant:acme")) == sorted(tagged)
    assert c.get(other).status is JobStatus.PENDING and c.get(tagged[0]).status is JobStatus.CANCELLED


def test_cancelling_a_finished_job_is_refused_and_leaves_it_as_it_was(c: Coordinator):
    done = c.enqueue(CreateFile(path="d.json", content=1)).id
    c.run_until_idle()
    [result] = c.cancel(done)
    assert result.outcome == "refused"
    assert result.error == f"job {done} is completed; only a pending or running job can be cancelled"
    assert c.get(done).status is JobStatus.COMPLETED


def test_a_running_job_is_cancelled_by_its_worker_and_its_effect_is_absent(
    c: Coordinator, running: Worker, root: Path, tmp_path: Path
):
    log = tmp_path / "started"
    job_id = c.enqueue(SlowWrite(path="slow.json", content=1, started=str(log))).id
    wait_for(lambda: started(log, job_id), "the handler to start")
    [result] = c.cancel(job_id, reason="not needed", wait=10)
    assert (result.outcome, result.effect) == ("cancelled", "absent")
    job = c.get(job_id)
    assert job.status is JobStatus.CANCELLED and job.locked_by is None
    assert job.last_error == "Cancelled: not needed (effect: absent)"
    assert not (root / "slow.json").exists()


def test_a_handler_that_returns_after_the_cancel_completes_its_job_as_the_data_root_shows(
    c: Coordinator, running: Worker, root: Path, tmp_path: Path
):
    log = tmp_path / "started"
    job_id = c.enqueue(
        SlowWrite(path="late.json", content=1, write_first=True, started=str(log), finish_anyway=True)
    ).id
    wait_for(lambda: started(log, job_id), "the handler to start")
    [result] = c.cancel(job_id, wait=10)
    assert result.outcome == "completed"  # the cancel came too late: the work was done
    assert c.get(job_id).status is JobStatus.COMPLETED and (root / "late.json").exists()


def test_a_running_job_that_wrote_its_file_is_cancelled_with_its_effect_landed(
    c: Coordinator, running: Worker, root: Path, tmp_path: Path
):
    log = tmp_path / "started"
    job_id = c.enqueue(SlowWrite(path="w.json", content=1, write_first=True, started=str(log))).id
    wait_for(lambda: started(log, job_id), "the handler to write and wait")
    [result] = c.cancel(job_id, wait=10)
    assert (result.outcome, result.effect) == ("cancelled", "landed")
    assert (root / "w.json").exists()


def test_the_children_of_a_cancelled_running_job_never_commit_and_its_target_runs_on(
    c: Coordinator, running: Worker, root: Path, tmp_path: Path
):
    log = tmp_path / "started"
    parent = c.enqueue(SlowWrite(path="p.json", content=1, children=["x", "y"], started=str(log))).id
    after = c.enqueue(CreateFile(path="p.json", content=2)).id
    wait_for(lambda: started(log, parent), "the parent to start")
    [result] = c.cancel(parent, wait=10)
    assert result.outcome == "cancelled"
    wait_for(lambda: c.get(after).status is JobStatus.COMPLETED, "the next job on the target to run")
    assert not (root / "children").exists()
    with c.engine.connect() as conn:
        children = conn.exec_driver_sql("SELECT count(*) FROM tether_jobs WHERE parent_id IS NOT NULL").scalar()
    assert children == 0


def test_a_cancel_request_is_fenced_on_the_attempt_it_saw(c: Coordinator):
    job_id = c.enqueue(CreateFile(path="f.json", content=1)).id
    [claimed] = c.queue.claim("w1")
    [result] = c.cancel(job_id)
    assert result.outcome == "requested"
    # The worker that holds the attempt sees the request; another worker's id does not.
    with c.queue.backend.read() as cur:
        assert cur.rows(c.queue.sql.CANCEL_REQUESTS, {"worker": "w2"}) == []
        rows = cur.rows(c.queue.sql.CANCEL_REQUESTS, {"worker": "w1"})
    assert rows == [(claimed.id, "cancelled by an operator")]


def test_a_cancelled_job_is_never_retried_and_purge_deletes_it(c: Coordinator, clock):
    job_id = c.enqueue(CreateFile(path="p.json", content=1)).id
    c.cancel(job_id)
    with pytest.raises(InvalidTransition, match=f"job {job_id} is cancelled; it cannot become pending"):
        c.retry(job_id)
    clock.advance(60)
    assert c.purge(older_than=timedelta(seconds=1), statuses=("cancelled",)).total == 1
    with pytest.raises(JobNotFound):
        c.get(job_id)


def test_show_tells_a_cancel_request_its_worker_has_yet_to_act_on(c: Coordinator, monkeypatch, capsys):
    import json

    from clikit import run_split

    job_id = c.enqueue(CreateFile(path="f.json", content=1)).id
    c.queue.claim("w1")
    url = c.engine.url.render_as_string(hide_password=False)
    code, out, _ = run_split(monkeypatch, capsys, "--db", url, "show", job_id, "--json")
    assert code == 0 and json.loads(out)["cancel_requested"] is None
    c.cancel(job_id, reason="wrong tenant")
    code, out, _ = run_split(monkeypatch, capsys, "--db", url, "show", job_id, "--json")
    assert code == 0 and json.loads(out)["cancel_requested"] == "wrong tenant"
    code, out, _ = run_split(monkeypatch, capsys, "--db", url, "show", job_id)
    assert code == 0 and "cancel requested" in out and "wrong tenant" in out


def test_a_job_that_keeps_changing_under_a_cancel_is_refused_alone(c: Coordinator, monkeypatch):
    moving = c.enqueue(CreateFile(path="m.json", content=1)).id
    still = c.enqueue(CreateFile(path="s.json", content=1)).id
    real = c.queue.transition

    def raced(cur, edge, job_id, **kw):  # another worker moves it each time, before the cancel can
        return None if job_id == moving else real(cur, edge, job_id, **kw)

    monkeypatch.setattr(c.queue, "transition", raced)
    results = {r.job_id: r for r in c.cancel(moving, still)}
    assert results[moving].outcome == "refused" and "kept changing" in (results[moving].error or "")
    assert results[still].outcome == "cancelled"  # one job's race does not undo the others
