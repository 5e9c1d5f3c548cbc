"""A target's whole history: every job that touched it, in order, and within each job every
attempt (when it started and ended, on which worker, how it ended), with operators' retries,
interleaved by time (``tether history``, ``Coordinator.history``, the ui's job page).

Each kind of record is a source of ``Entry`` values: the jobs themselves (their enqueue), the
attempt rows (``ledger/attempts.py``), and the attempt a job row tells (a completed or running
job's latest). ``merge`` interleaves the sources by time, so another kind of record on a target
is one more source passed to it, not a change to the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Any, NamedTuple

import sqlalchemy as sa

from ..errors import UnknownTarget
from ..jobtypes.target import display, named
from ..ledger.attempts import Outcome
from ..ledger.record import JobRecord
from ..ledger.schema import attempts as attempts_table
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .readonly import Source, reading, records, select_jobs

ENQUEUED = "enqueued"
"""A job that acts on the target entered the ledger."""
ATTEMPT = "attempt"
"""One run of a job: ``outcome`` says how it ended (``Outcome``)."""
MANUAL_RETRY = "manual_retry"
"""An operator retried the failed job: its attempts count from one again."""

_LAST = 1 << 62  # a job row's own attempt sorts after the rows written before it at one instant


class Entry(NamedTuple):
    """One event in a target's history."""

    at: datetime
    """When it happened (an attempt: when its claim took the job)."""
    kind: str
    job_id: str
    job_type: str
    attempt: int | None = None
    outcome: str | None = None
    worker: str | None = None
    ended_at: datetime | None = None
    detail: str | None = None
    """An attempt's error (its first line); for an enqueue, the job's status now."""
    seq: int = 0
    """Order among one job's entries of one instant (the attempt row's id)."""

    def to_dict(self) -> dict[str, Any]:
        out = self._asdict()
        del out["seq"]
        out["at"] = self.at.isoformat()
        out["ended_at"] = self.ended_at.isoformat() if self.ended_at else None
        return out


@dataclass(frozen=True)
class History:
    """The history of one target (``key``, its ordering key): its newest jobs, oldest first, and
    their entries in time order; ``more`` when older jobs on it were left out."""

    key: str
    jobs: list[JobRecord]
    entries: list[Entry]
    more: bool

    @property
    def target(self) -> str:
        return display(self.key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "key": self.key,
            "jobs": [j.id for j in self.jobs],
            "older_jobs_left_out": self.more,
            "entries": [e.to_dict() for e in self.entries],
        }


def merge(*sources: Iterable[Entry]) -> list[Entry]:
    """The entries of every source in one time order. At one instant, jobs in enqueue order; within
    a job its enqueue first, then the rest in the order written."""
    return sorted(chain(*sources), key=lambda e: (e.at, e.job_id, e.kind != ENQUEUED, e.seq))


def history(source: Source, name: str, *, limit: int | None = 50) -> History:
    """The history of the target ``name`` (as ``jobtypes.target.named`` reads it), over its newest
    ``limit`` jobs (None: all). UnknownTarget when no job has touched it."""
    with reading(source) as conn:
        for key in named(name):
            query = select_jobs().where(jobs_table.c.ordering_key == key).order_by(jobs_table.c.id.desc())
            found = records(conn, query if limit is None else query.limit(limit + 1))
            if found:
                break
        else:
            raise UnknownTarget(name)
        more = limit is not None and len(found) > limit
        jobs = list(reversed(found[:limit] if limit is not None else found))
        rows = attempt_rows(conn, jobs)
    return History(key, jobs, merge(enqueues(jobs), rows, job_row_attempts(jobs)), more)


def job_attempts(source: Source, job: JobRecord) -> list[Entry]:
    """Every attempt of one job (and the operator's retries of it), in order."""
    with reading(source) as conn:
        return merge(attempt_rows(conn, [job]), job_row_attempts([job]))


def enqueues(jobs: Iterable[JobRecord]) -> list[Entry]:
    return [Entry(j.created_at, ENQUEUED, j.id, j.type, detail=f"now {j.status.value}") for j in jobs]


def job_row_attempts(jobs: Iterable[JobRecord]) -> list[Entry]:
    """The attempt each job row tells: a completed job's last (no row is written for it), a
    claimed job's current one."""
    out = []
    for j in jobs:
        if j.claimed_at is None or j.status not in (JobStatus.COMPLETED, JobStatus.CLAIMED):
            continue
        done = j.status is JobStatus.COMPLETED
        outcome = Outcome.COMPLETED if done else Outcome.RUNNING
        ended = j.completed_at if done else None
        out.append(Entry(j.claimed_at, ATTEMPT, j.id, j.type, j.attempts, outcome.value, j.locked_by, ended, seq=_LAST))
    return out


def attempt_rows(conn: sa.Connection, jobs: Sequence[JobRecord]) -> list[Entry]:
    """The attempt rows of ``jobs`` (and their operators' retries)."""
    types = {j.id: j.type for j in jobs}
    a = attempts_table.c
    out: list[Entry] = []
    ids = list(types)
    for start in range(0, len(ids), 500):  # a bounded IN list per statement
        query = sa.select(a.id, a.job_id, a.attempt, a.started_at, a.ended_at, a.worker, a.outcome, a.error)
        for row_id, job_id, attempt, started, ended, worker, outcome, error in conn.execute(
            query.where(a.job_id.in_(ids[start : start + 500])).order_by(a.id)
        ):
            kind = MANUAL_RETRY if outcome == Outcome.MANUAL_RETRY else ATTEMPT
            out.append(Entry(started, kind, job_id, types[job_id], attempt, outcome, worker, ended, error, row_id))
    return out
