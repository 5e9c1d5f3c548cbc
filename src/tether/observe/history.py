"""A target's whole history: every job that touched it, in order, and within each job every
attempt (when it started and ended, on which worker, how it ended), with operators' retries,
the repairs applied to it, the operators' accepts with their reasons, and the drift findings of
the kept reconcile runs, interleaved by time (``tether history``, ``Coordinator.history``, the
ui's job page).

Each kind of record is a source of ``Entry`` values: the jobs themselves (their enqueue), the
attempt rows (``ledger/attempts.py``), the attempt a job row tells (a completed or running job's
latest), the repair links (``reconcile/repair.py``), the accepts (``adopt`` jobs) and the kept
findings (``reconcile/findings.py``). ``merge`` interleaves the sources by time, so another
kind of record on a target is one more source passed to it, not a change to the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Any, NamedTuple

import sqlalchemy as sa

from ..errors import UnknownTarget
from ..jobtypes.adopt import Adopt
from ..jobtypes.target import display, named
from ..ledger.attempts import Outcome
from ..ledger.record import JobRecord
from ..ledger.schema import attempts as attempts_table
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from ..reconcile.drift import DRIFT as DRIFT_STATUSES
from ..reconcile.findings import of_target
from ..reconcile.repair import repairs_of
from .readonly import Source, reading, records, select_jobs

ENQUEUED = "enqueued"
"""A job that acts on the target entered the ledger."""
ATTEMPT = "attempt"
"""One run of a job: ``outcome`` says how it ended (``Outcome``)."""
MANUAL_RETRY = "manual_retry"
"""An operator retried the failed job: its attempts count from one again."""
REPAIR = "repair"
"""An applied repair plan enqueued the job: ``outcome`` is the finding it answers."""
ACCEPTED = "accepted"
"""An operator accepted what is there as the target's expected state (``tether drift accept``)."""
DRIFT = "drift"
"""A reconcile run found the target not in sync: ``outcome`` is its status (``missing``,
``modified``...); ``detail`` names the ignore rule when one matched."""

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

    @property
    def event(self) -> str:
        """What happened, in a word or two: an attempt's outcome, a finding's status after its kind."""
        if self.kind == ATTEMPT:
            return str(self.outcome)
        return f"{self.kind} {self.outcome}" if self.kind in (REPAIR, DRIFT) else self.kind

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
        types = {j.id: j.type for j in jobs}
        repaired = [_repair_entry(r, types) for r in repairs_of(conn, key)]
        drifts = [_drift_entry(*f) for f in of_target(conn, display(key)) if f[1] in DRIFT_STATUSES]
    entries = merge(enqueues(jobs), rows, job_row_attempts(jobs), repaired, accepts(jobs), drifts)
    if more:  # the records older than the oldest job shown belong to the jobs left out
        entries = [e for e in entries if e.at >= jobs[0].created_at]
    return History(key, jobs, entries, more)


def job_attempts(source: Source, job: JobRecord) -> list[Entry]:
    """Every attempt of one job (and the operator's retries of it), in order."""
    with reading(source) as conn:
        return merge(attempt_rows(conn, [job]), job_row_attempts([job]))


def enqueues(jobs: Iterable[JobRecord]) -> list[Entry]:
    return [Entry(j.created_at, ENQUEUED, j.id, j.type, detail=f"now {j.status.value}") for j in jobs]


def accepts(jobs: Iterable[JobRecord]) -> list[Entry]:
    """The accepts among ``jobs``: who accepted what is there, and why (the operator's own words,
    not an application's payload)."""
    out = []
    for j in jobs:
        if j.type == Adopt.job_type:
            told = Adopt.model_validate_json(j.payload)
            why = f": {told.reason}" if told.reason else ""
            out.append(Entry(j.created_at, ACCEPTED, j.id, j.type, detail=f"by {told.by}{why}", seq=1))
    return out


def _repair_entry(row: dict[str, Any], types: dict[str, str]) -> Entry:
    again = f"runs {row['repair_of']} again" if row["repair_of"] else "made for the finding"
    job_id = str(row["job_id"])
    at = row["applied_at"]
    return Entry(at, REPAIR, job_id, types.get(job_id, ""), outcome=str(row["finding"]), detail=again, seq=1)


def _drift_entry(at: datetime, status: str, rule: str | None, finding: dict[str, Any]) -> Entry:
    detail = f"ignored by {rule}" if rule else finding.get("detail")
    job_id, job_type = finding.get("job_id") or "", finding.get("job_type") or ""
    return Entry(at, DRIFT, job_id, job_type, outcome=status, detail=detail)


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
