"""An operator's cancel of a running job, as its worker carries it out.

The operator's side (``ledger/cancel.py``) marks the running job's row with a reason, fenced on
the attempt it saw. The worker asks the ledger about the jobs it holds (``watch_once``: one probe
of a partial index that is empty while nobody cancels, made by the supervising thread about twice
a second while any job runs, so a cancel from any machine is seen within a second without a
heartbeat's write); it
cancels each one asked for (``ctx.cancelled`` is set, the reason ``cancelled``; an assistant's
process group is ended as at a timeout). However the handler then ends, the attempt is recorded
``cancelled`` with the verdict of the type's probe on its effect (``effect_of``), and its
follow-up jobs are never inserted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import events
from ..jobtypes.base import IN_SYNC, UNKNOWN
from ..jobtypes.context import CANCELLED
from ..ledger.record import JobRecord

if TYPE_CHECKING:
    from ..ledger.queue import Queue
    from .executor import Executor

WATCH_EVERY = 0.5
"""Seconds between two reads of the cancel requests for a worker's running jobs."""

LANDED, ABSENT = "landed", "absent"
NOT_CHECKED = "not_checked"  # a remote probe left alone: as unknown


def effect_of(queue: Queue, job: JobRecord) -> str:
    """Whether ``job``'s effect is in the world now, by its type's probe (the reconciler's):
    ``landed`` when the target holds what the job would leave there, ``absent`` when it does
    not, ``unknown`` when the type has no probe or target, or the probe cannot tell."""
    try:
        probe = queue.registry.get(job.type).probe
    except Exception:  # a type this worker no longer has cannot be judged
        return UNKNOWN
    if probe is None or job.ordering_key is None:
        return UNKNOWN
    try:
        check = probe.check(job.ordering_key, job.payload, queue.root, content=True)
    except Exception:  # a probe never raises for an unreadable target; one that does cannot tell
        return UNKNOWN
    if check.status == IN_SYNC:
        return LANDED
    return UNKNOWN if check.status in (UNKNOWN, NOT_CHECKED) else ABSENT


def watch_once(queue: Queue, executor: Executor, worker: str) -> list[str]:
    """Cancel the running jobs an operator asked to cancel; returns their ids. Nothing is read
    while no job runs; the read is one probe of an index that is empty while nobody cancels."""
    if not executor.busy():
        return []
    with queue.backend.read() as cur:
        asked = cur.rows(queue.sql.CANCEL_REQUESTS, {"worker": worker})
    if not asked:
        return []
    running = {ctx.job.id: ctx for ctx in executor.running()}
    seen = []
    for job_id, reason in asked:
        ctx = running.get(job_id)
        if ctx is not None and ctx.cancel_note is None:
            events.emit("cancel_seen", job_id=job_id, type=ctx.job.type, attempt=ctx.job.attempts, worker=worker)
            ctx.cancel(CANCELLED, reason)
            seen.append(job_id)
    return seen
