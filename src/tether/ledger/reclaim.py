"""A claimed job's lock: renewed by heartbeats, swept when stale, and who is to blame when a
worker dies (the sweep's verdict on each job it held).

A worker claims up to a batch of jobs in one statement and records their outcomes in group
commits, so when it dies (a segfault, the OOM killer, ``os._exit`` in a handler) the ledger
knows which of its jobs have no committed outcome, but not which one was running. Writing a
"now running" mark before every job would cost a commit per job, the very thing batching saves.

So the sweep judges by claim (jobs that share ``locked_by`` and ``claimed_at`` came from one
claim statement):

- **alone**: the claim's only job without an outcome was the one running (or it finished and
  the worker died before recording it): it keeps the attempt its claim counted, fails if that
  was its last, and is quarantined (``crashed``).
- **batch**: several jobs of the claim have no outcome; any one of them may have killed the
  worker. Each gets its attempt back and is quarantined as a suspect of that claim
  (``suspect:<claim>``). A quarantined job is claimed alone (CLAIM in statements/sqlite.sql), so from then on a
  crash is pinned on exactly one job.
- A suspect that then kills its worker alone is charged that earlier batch crash too (it was the
  first of the batch to crash alone; suspects run in the batch's own order), and the batch's
  other suspects are acquitted of it (``suspect``): a poison job fails after exactly
  ``max_attempts`` crashes while it was running, and no batch-mate loses an attempt for it.

A job on its last attempt is claimed alone too (CLAIM in statements/sqlite.sql), so the crash that uses up its last
attempt is always pinned at once: with ``max_attempts`` 1 every job runs alone, at a commit each.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import events
from ..clock import DatabaseClock
from . import attempts
from .lifecycle import EDGES, ENDING
from .record import JobRecord

if TYPE_CHECKING:
    from .queue import Queue

CRASHED = "crashed"  # a worker died while running it alone
SUSPECT = "suspect"  # it was in a crashed batch whose crash another job has been charged for
_SUSPECT_OF = "suspect:"  # + the claim: it was in that crashed batch, which nobody has been charged for yet


class Verdict(NamedTuple):
    """What the sweep does to one stale job: ``edge`` (reclaim or reclaim_exhausted) with the
    attempt count, quarantine and error it sets; ``acquit`` names the crashed batch whose other
    suspects no longer owe its crash."""

    job: JobRecord
    edge: str
    attempts: int
    quarantine: str
    error: str
    acquit: str | None = None


def claim_of(job: JobRecord) -> str:
    """The claim statement that took ``job``: its worker and claim time."""
    claimed_at = job.claimed_at.isoformat() if job.claimed_at else "?"
    return f"{job.locked_by} {claimed_at}"


def verdicts(stale: Iterable[JobRecord]) -> list[Verdict]:
    """The verdict on each of ``stale`` (claimed jobs whose lock expired), in claim order."""
    claims: dict[str, list[JobRecord]] = {}
    for job in sorted(stale, key=lambda j: (-j.priority, j.created_at, j.id)):
        claims.setdefault(claim_of(job), []).append(job)
    charged: set[str] = set()  # crashed batches charged in this sweep
    out = []
    for claim, jobs in claims.items():
        lock = f"lock of worker {jobs[0].locked_by} expired"
        if len(jobs) > 1:
            for job in jobs:
                error = (
                    f"worker died while running a batch of {len(jobs)} jobs holding this one (reclaimed, attempt "
                    f"given back; it runs alone until it completes or fails): {lock}"
                )
                out.append(Verdict(job, "reclaim", job.attempts - 1, _SUSPECT_OF + claim, error))
            continue
        [job] = jobs
        owed = job.quarantine or ""
        acquit = None
        attempts = job.attempts
        if owed.startswith(_SUSPECT_OF) and owed not in charged:
            # The batch crash it was suspected of: it has now killed a worker alone.
            charged.add(owed)
            acquit = owed
            attempts = min(attempts + 1, job.max_attempts)
        edge = "reclaim_exhausted" if attempts >= job.max_attempts else "reclaim"
        left = "; no attempts left" if edge == "reclaim_exhausted" else ""
        error = f"worker died while running (reclaimed, attempt {attempts} of {job.max_attempts}{left}): {lock}"
        out.append(Verdict(job, edge, attempts, CRASHED, error, acquit))
    return out


def renew(queue: Queue, worker: str, jobs: Sequence[JobRecord], now: datetime | None) -> list[str]:
    """Renew ``worker``'s locks on ``jobs`` (a heartbeat: they are not stale while it beats), and
    its row in the register of workers (``workers.py``), idle or not, so the pages tell an idle
    worker from a dead one; the ids it no longer holds."""

    def renew_in(cur: Any) -> list[str]:
        params = {"worker": worker, "now": now or lock_time(queue, cur)}
        cur.execute(queue.sql.WORKER_BEAT, {"id": worker, "now": params["now"]})
        renewed = [cur.execute(queue.sql.HEARTBEAT, {**params, "id": j.id, "attempt": j.attempts}) for j in jobs]
        return [job.id for job, n in zip(jobs, renewed, strict=True) if n == 0]

    return queue.backend.transact(renew_in)


def lock_time(queue: Queue, cur: Any) -> datetime:
    """Now, as lock ages are measured. With the database's clock (``clock.DatabaseClock``) that
    is the database's own time, read in ``cur``'s transaction, which the clock then goes on
    from; otherwise the queue's clock's time."""
    if isinstance(queue.clock, DatabaseClock):
        return queue.clock.sync(partial(cur.scalar, queue.sql.DATABASE_TIME))
    return queue.clock.now()


def sweep(queue: Queue, lock_timeout: float, now: datetime | None) -> list[JobRecord]:
    """Move ``queue``'s claimed jobs whose lock is older than ``lock_timeout`` seconds by their
    verdicts, in one transaction; returns the jobs moved, those back to pending first."""
    moved = queue.backend.transact(lambda cur: _sweep_in(queue, cur, lock_timeout, now))
    for edge, job in moved:
        queue.emit_edge(edge, job, None)
    if any(edge == "reclaim" for edge, _ in moved):
        queue.wakeup.wake_local()
    _unblock_lost_heads(queue)
    return [job for edge, job in moved if edge == "reclaim"] + [job for edge, job in moved if edge != "reclaim"]


def _sweep_in(queue: Queue, cur: Any, lock_timeout: float, now: datetime | None) -> list[tuple[str, JobRecord]]:
    """The sweep's transaction: (edge, job) for each job it moved. Lock ages are measured by the
    time read in this transaction (``lock_time``)."""
    now = now or lock_time(queue, cur)
    cutoff = now - timedelta(seconds=lock_timeout)
    moved: list[tuple[str, JobRecord]] = []
    for v in verdicts(cur.records(queue.sql.STALE, {"cutoff": cutoff})):
        values: dict[str, Any] = {
            "attempts": v.attempts,
            "quarantine": v.quarantine,
            "error": v.error,
            "cutoff": cutoff,
        }
        if v.edge == "reclaim_exhausted":
            values["now"] = now
        job = queue.transition(cur, v.edge, v.job.id, worker=v.job.locked_by, attempt=v.job.attempts, **values)
        if job is None:  # renewed since it was read (PostgreSQL: a heartbeat got in first)
            continue
        assert isinstance(job, JobRecord)
        moved.append((v.edge, job))
        row = attempts.row(
            v.job, EDGES[v.edge].attempt or attempts.Outcome.RECLAIMED, now, worker=v.job.locked_by, error=v.error
        )
        cur.execute(queue.sql.INSERT_ATTEMPT, row)
        if v.acquit is not None:
            cur.execute(queue.sql.ACQUIT, {"quarantine": v.acquit, "acquitted": SUSPECT})
    queue.unblock_next(cur, [job for edge, job in moved if edge in ENDING])
    if any(edge == "reclaim" for edge, _ in moved):
        queue.wakeup.notify_in(cur)
    return moved


def _unblock_lost_heads(queue: Queue) -> None:
    """The sweep's safety net: unblock each target's oldest active job left blocked (see
    LOST_HEADS in the catalogue); normally there is none, and only a read is made."""
    with queue.backend.read() as cur:
        if cur.scalar(queue.sql.ANY_BLOCKED) is None:
            return
        lost = [job_id for (job_id,) in cur.rows(queue.sql.LOST_HEADS)]
    if not lost:
        return
    unblocked = queue.backend.transact(lambda cur: _unblock_heads_in(queue, cur, lost))
    if unblocked:
        events.emit("unblocked", jobs=unblocked)
        queue.wakeup.wake_local()


def _unblock_heads_in(queue: Queue, cur: Any, heads: list[str]) -> int:
    unblocked: int = sum(cur.execute(queue.sql.UNBLOCK_HEAD, {"id": job_id}) for job_id in heads)
    if unblocked:
        queue.wakeup.notify_in(cur)
    return unblocked
