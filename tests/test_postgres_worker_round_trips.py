"""A PostgreSQL worker's transactions as the server sees them: a claim, and a group commit that
claims the next batch, each one round trip on a kept connection (BEGIN, the statements and
COMMIT sent before any answer is read); a transaction that reads an answer before its end
(a retry's fenced count) still sees whether its job moved."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conftest import scratch_pg_database
from jobkit import Note, NoteType, completed, registry_with
from pgwire import round_trips, statements, traced
from tether import Coordinator, CreateFile, JobStatus
from tether.ledger import pausing
from tether.ledger.lifecycle import Decision


@pytest.fixture
def c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Coordinator]:
    # The paused types are read again every pausing.REFRESH seconds, in a claim's transaction
    # and before its CLAIM (which leaves them out): here once, before the transactions traced.
    monkeypatch.setattr(pausing, "REFRESH", 1e9)
    with scratch_pg_database("tether_worker_trips") as url:
        with Coordinator.open(url, root=tmp_path / "data", registry=registry_with(NoteType())) as coordinator:
            assert coordinator.queue.claim("warm-up", limit=0) == []
            yield coordinator


def test_a_claim_is_one_round_trip(c, tmp_path):
    ids = [r.id for r in c.enqueue_many([Note(name=f"a{n}") for n in range(3)])]
    claimed, messages = traced(c, tmp_path / "trace", lambda: c.queue.claim("w", limit=10))
    assert sorted(job.id for job in claimed) == sorted(ids)
    assert round_trips(messages) == 1
    assert statements(messages) == ["BEGIN", "SET", "WITH", "COMMIT"]


def finish_and_claim_the_next(
    c: Coordinator, path: Path, first: list[Any], second: list[Any]
) -> tuple[list[str], list[list[str]]]:
    """Enqueue ``first`` then ``second``, claim ``first``, and trace the group commit that
    completes it and claims ``second`` (checked: all of ``first`` moved, all of ``second``
    claimed); returns the ids of ``first`` and the commit's protocol messages."""
    first_ids = [r.id for r in c.enqueue_many(first)]
    second_ids = [r.id for r in c.enqueue_many(second)]
    jobs = c.queue.claim("w", limit=len(first))
    assert sorted(job.id for job in jobs) == sorted(first_ids)

    def finish() -> tuple[list[Any], list[Any]]:
        return c.queue.finish_and_claim("w", [completed(job) for job in jobs], records=False, claim=10)

    (moved, following), messages = traced(c, path, finish)
    assert moved == [True] * len(first)
    assert sorted(job.id for job in following) == sorted(second_ids)  # on targets: unblocked, then claimed
    return first_ids, messages


def test_a_group_commit_that_claims_the_next_batch_is_one_round_trip(c, tmp_path):
    notes = [[Note(name=f"{batch}{n}") for n in range(2)] for batch in "ab"]
    first, messages = finish_and_claim_the_next(c, tmp_path / "trace", *notes)
    assert round_trips(messages) == 1
    # The completions in one statement, then the claim, then COMMIT: no answer read between.
    assert statements(messages) == ["BEGIN", "UPDATE", "SET", "WITH", "COMMIT"]
    assert {c.get(i).status for i in first} == {JobStatus.COMPLETED}


def test_a_group_commit_sees_which_jobs_kept_their_lease(c):
    ids = [r.id for r in c.enqueue_many([Note(name=f"a{n}") for n in range(4)])]
    jobs = sorted(c.queue.claim("w", limit=4), key=lambda job: ids.index(job.id))
    with c.engine.begin() as conn:  # another worker holds the first two now
        conn.exec_driver_sql("UPDATE tether_jobs SET locked_by = 'other' WHERE id IN (%s, %s)", (ids[0], ids[1]))
    retry_at = jobs[0].created_at + timedelta(hours=1)
    decisions = [
        completed(jobs[0]),
        Decision.retry(jobs[1], "boom", retry_at),
        completed(jobs[2]),
        Decision.retry(jobs[3], "boom", retry_at),
    ]
    # The completions' answer is read after the commit; each retry's count before the next.
    moved, _ = c.queue.finish_and_claim("w", decisions, records=False)
    assert moved == [None, None, True, True]
    assert [c.get(i).status for i in ids] == [
        JobStatus.CLAIMED,
        JobStatus.CLAIMED,
        JobStatus.COMPLETED,
        JobStatus.PENDING,
    ]


def test_a_group_commit_of_jobs_on_targets_waits_for_one_answer(c, tmp_path):
    # The one answer read before the commit: whether any job waits behind a target (ANY_BLOCKED).
    files = [[CreateFile(path=f"{n}.json", content=sign * n) for n in range(2)] for sign in (1, -1)]
    _, messages = finish_and_claim_the_next(c, tmp_path / "trace", *files)
    assert round_trips(messages) == 2


def test_a_completion_that_lost_its_lease_leaves_the_job_behind_it_blocked(c):
    ahead, behind, other = (
        r.id
        for r in c.enqueue_many(
            [
                CreateFile(path="a.json", content=1),
                CreateFile(path="a.json", content=2),
                CreateFile(path="b.json", content=3),
            ]
        )
    )
    jobs = c.queue.claim("w", limit=10)
    assert sorted(job.id for job in jobs) == sorted([ahead, other])  # behind waits for ahead
    with c.engine.begin() as conn:  # another worker holds the job ahead now
        conn.exec_driver_sql("UPDATE tether_jobs SET locked_by = 'other' WHERE id = %s", (ahead,))
    moved, following = c.queue.finish_and_claim("w", [completed(job) for job in jobs], records=False, claim=10)
    assert dict(zip([job.id for job in jobs], moved, strict=True)) == {ahead: None, other: True}
    assert following == []  # the job behind is still blocked: the one ahead of it is running
    with c.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT blocked FROM tether_jobs WHERE id = %s", (behind,)).scalar_one() is True
