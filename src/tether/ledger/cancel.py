"""An operator's cancel: a pending job is cancelled at once, a running one is asked to stop.

A pending job takes the ``cancel`` edge and leaves the active set, so the next job on its target
is unblocked in the same transaction (as when a job ends). A running job's row gets the reason
(REQUEST_CANCEL), fenced on the worker and attempt read, so a request never lands on a later
attempt than the one the operator saw; its worker sees the request within a second and records
the job ``cancelled`` with its effect's verdict (``worker/cancels.py``). A finished job is
refused (NotCancellable).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
import sqlalchemy as sa

from .. import events
from ..errors import ConfigError, JobKeptChanging, JobNotFound, NotCancellable
from .record import JobRecord
from .schema import job_tags, jobs
from .status import ACTIVE, JobStatus

if TYPE_CHECKING:
    from .queue import Queue

CANCELLED, REQUESTED, REFUSED = "cancelled", "requested", "refused"
DEFAULT_REASON = "cancelled by an operator"
CHUNK = 100  # jobs cancelled per transaction: one commit each, never a long hold on the write lock


class CancelResult(NamedTuple):
    """What a cancel did to one job: ``cancelled`` (it was pending, or its worker has recorded
    it), ``requested`` (running: its worker has not recorded it yet), ``refused`` (``error``), or,
    for a job chosen by type or key, the status it ended in before the cancel reached it."""

    job_id: str
    outcome: str
    job: JobRecord | None = None
    error: str | None = None

    @property
    def effect(self) -> str | None:
        """The verdict on a running job's effect its worker recorded (``landed``, ``absent``,
        ``unknown``); None for a job cancelled before it ran, or not yet recorded."""
        if self.job is None or self.job.status is not JobStatus.CANCELLED or not self.job.result:
            return None
        try:
            effect = orjson.loads(self.job.result).get("effect")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return str(effect) if effect is not None else None


def selected(queue: Queue, job_type: str | None, key: str | None, tag: str | None = None) -> list[str]:
    """The ids of the active jobs of ``job_type``, with idempotency key ``key`` and carrying
    ``tag`` (each when given), oldest first."""
    query = sa.select(jobs.c.id).where(jobs.c.status.in_([s.value for s in ACTIVE]))
    if job_type is not None:
        query = query.where(jobs.c.type == job_type)
    if key is not None:
        query = query.where(jobs.c.idempotency_key == key)
    if tag is not None:  # the tag's range of tether_job_tags' primary key
        query = query.where(jobs.c.id.in_(sa.select(job_tags.c.job_id).where(job_tags.c.tag == tag)))
    with queue.engine.connect() as conn:
        return list(conn.execute(query.order_by(jobs.c.id)).scalars())


def cancel(
    queue: Queue,
    job_ids: Iterable[str] = (),
    *,
    job_type: str | None = None,
    key: str | None = None,
    tag: str | None = None,
    reason: str | None = None,
    wait: float = 0.0,
) -> list[CancelResult]:
    """Cancel each of ``job_ids``, or every active job of ``job_type``, with idempotency ``key``
    and carrying ``tag`` (those given); with ``wait``, wait up to that many seconds for the
    workers running some of them to record their cancels."""
    job_ids = list(job_ids)
    if bool(job_ids) == (job_type is not None or key is not None or tag is not None):
        raise ConfigError("cancel: give job ids, or a type, a key and/or a tag (not both, not neither)")
    chosen = not job_ids  # chosen by type, key or tag: one that ends meanwhile is no error
    job_ids = job_ids or selected(queue, job_type, key, tag)
    note = (reason or DEFAULT_REASON).strip()[:500] or DEFAULT_REASON
    results: list[CancelResult] = []
    for start in range(0, len(job_ids), CHUNK):
        chunk = job_ids[start : start + CHUNK]
        results += queue.backend.transact(partial(_cancel_all_in, queue, job_ids=chunk, note=note, chosen=chosen))
    for result in results:
        if result.outcome == CANCELLED and result.job is not None:
            queue.emit_edge("cancel", result.job, None)
        elif result.outcome == REQUESTED and result.job is not None:
            job = result.job
            events.emit("cancel_requested", job_id=job.id, type=job.type, attempt=job.attempts, worker=job.locked_by)
    if any(r.outcome == CANCELLED for r in results):
        queue.wakeup.wake_local()
    return _waited(queue, results, wait) if wait > 0 else results


def _cancel_all_in(queue: Queue, cur: Any, *, job_ids: list[str], note: str, chosen: bool) -> list[CancelResult]:
    """The cancels of ``job_ids`` in ``cur``'s transaction. A job that cannot be cancelled is
    refused, or, when ``chosen`` by type or key, reported in the status it ended in meanwhile."""
    results = []
    for job_id in job_ids:
        try:
            results.append(_cancel_in(queue, cur, job_id, note))
        except NotCancellable as e:
            results.append(CancelResult(job_id, e.current) if chosen else CancelResult(job_id, REFUSED, error=str(e)))
        except (JobNotFound, JobKeptChanging) as e:
            results.append(CancelResult(job_id, REFUSED, error=str(e)))
    return results


def _cancel_in(queue: Queue, cur: Any, job_id: str, note: str) -> CancelResult:
    """One job's cancel in ``cur``'s transaction; read again if a worker moved it meanwhile."""
    for _ in range(5):
        job = queue.get(job_id, cur=cur)
        if job.status is JobStatus.PENDING:
            moved = queue.transition(cur, "cancel", job_id, now=queue.clock.now(), error=f"Cancelled: {note}")
            if isinstance(moved, JobRecord):
                queue.unblock_next(cur, [moved])
                queue.wakeup.notify_in(cur)
                return CancelResult(job_id, CANCELLED, moved)
        elif job.status is JobStatus.CLAIMED:
            params = {"id": job_id, "reason": note, "worker": job.locked_by, "attempt": job.attempts}
            if cur.execute(queue.sql.REQUEST_CANCEL, params) == 1:
                return CancelResult(job_id, REQUESTED, job)
        else:
            raise NotCancellable(job_id, job.status.value)
    raise JobKeptChanging(job_id)


def _waited(queue: Queue, results: list[CancelResult], wait: float) -> list[CancelResult]:
    """``results`` with each requested cancel read again until its worker recorded it or
    ``wait`` seconds passed."""
    deadline = time.monotonic() + wait
    while True:
        results = [r if r.outcome != REQUESTED else _reread(queue, r) for r in results]
        if all(r.outcome != REQUESTED for r in results) or time.monotonic() >= deadline:
            return results
        time.sleep(0.05)


def _reread(queue: Queue, result: CancelResult) -> CancelResult:
    job = queue.get(result.job_id)
    if job.status is JobStatus.CLAIMED:
        return result
    return CancelResult(result.job_id, CANCELLED if job.status is JobStatus.CANCELLED else job.status.value, job)
