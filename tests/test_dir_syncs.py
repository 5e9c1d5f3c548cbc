"""Directory fsyncs shared by the jobs of one group commit (tether/jobtypes/datafiles/dirsync.py): each
directory once per commit, always before it, and a failed one keeps its jobs from completing."""

from __future__ import annotations

import errno
import os

import pytest

from tether.jobtypes import CreateFile, DeleteFile
from tether.jobtypes.datafiles import durable
from tether.ledger.queue import Queue
from tether.ledger.status import JobStatus

# A batch that never turns slow and is recorded in one group commit, however loaded the machine.
ONE_COMMIT = {"slow_job": 60.0, "flush_after": 60.0}


@pytest.fixture
def order(monkeypatch) -> list[tuple[str, str]]:
    """("fsync", real path) for every directory fsynced and ("commit", job ids completed) for every
    group commit, in the order they happen."""
    events: list[tuple[str, str]] = []
    real_fsync, real_finish = durable.fsync_fd, Queue.finish_and_claim

    def fsync(fd):
        real_fsync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            events.append(("fsync", path))

    def finish_and_claim(queue, worker, decisions, **kw):
        events.append(("commit", " ".join(d.job.id for d in decisions if d.edge == "complete")))
        return real_finish(queue, worker, decisions, **kw)

    monkeypatch.setattr(durable, "fsync_fd", fsync)
    monkeypatch.setattr(Queue, "finish_and_claim", finish_and_claim)
    return events


def test_jobs_of_one_group_commit_fsync_each_directory_once_and_before_the_commit(coordinator, root, order):
    for d in ("a", "b", "c"):
        (root / d).mkdir()
    creates = [CreateFile(path=f"{'abc'[i % 3]}/f{i}.json", content=i) for i in range(30)]
    (root / "a/gone.json").write_text("x")
    ids = [r.job.id for r in coordinator.enqueue_many([*creates, DeleteFile(path="a/gone.json")])]
    assert coordinator.worker(**ONE_COMMIT).run_until_idle() == 31
    assert {coordinator.get(i).status for i in ids} == {JobStatus.COMPLETED}

    real = os.path.realpath(root)
    commits = [n for n, (kind, _) in enumerate(order) if kind == "commit" and order[n][1]]
    assert len(commits) == 1  # one group commit recorded all 31
    synced_before = [path for kind, path in order[: commits[0]] if kind == "fsync"]
    # the root once per new directory (its entry), then each data directory once: not 31 times
    assert sorted(p for p in synced_before if p != real) == [f"{real}/{d}" for d in "abc"]
    assert [kind for kind, _ in order[commits[0] :]] == ["commit"]  # nothing owed after it


def test_a_failed_shared_directory_fsync_retries_the_jobs_of_that_directory_only(coordinator, root, clock, monkeypatch):
    for d in ("ok", "bad"):
        (root / d).mkdir()
    payloads = [CreateFile(path=f"{'ok' if i % 2 else 'bad'}/f{i}.json", content=i) for i in range(10)]
    ids = [r.job.id for r in coordinator.enqueue_many(payloads)]
    bad = os.path.realpath(root / "bad")
    real_fsync = durable.fsync_fd

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}") == bad:
            raise OSError(errno.EIO, "injected I/O error")
        real_fsync(fd)

    monkeypatch.setattr(durable, "fsync_fd", fsync)
    coordinator.worker(**ONE_COMMIT).run_until_idle()
    for job_id, p in zip(ids, payloads, strict=True):
        job = coordinator.get(job_id)
        if p.path.startswith("ok/"):
            assert job.status is JobStatus.COMPLETED
        else:  # renamed, but the entry is not durable: retried, the cause named
            assert job.status is JobStatus.PENDING, p.path
            assert "injected I/O error" in job.last_error and p.path in job.last_error
            assert (root / p.path).exists()
    monkeypatch.setattr(durable, "fsync_fd", real_fsync)
    clock.advance(3600)
    coordinator.run_until_idle()
    assert {coordinator.get(i).status for i in ids} == {JobStatus.COMPLETED}
