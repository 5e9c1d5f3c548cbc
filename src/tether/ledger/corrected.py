"""A retry with a corrected payload: a new job, validated as any enqueue, linked to the failed one
(``retry_of``) and carrying its tags and meta. The failed job and its payload stay as they are,
as evidence of what was asked and why it failed; ``tether show`` names each from the other.

The order per target holds as for a plain retry (``Queue.manual_retry``): once a newer job on the
failed job's target is queued or done, a retry would undo it, so it is refused (Superseded). A
failed job is retried with a corrected payload once: a second one is refused, naming the first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import AlreadyRetried, DuplicateActiveJob, InvalidPayload, InvalidTransition, Superseded
from ..jobtypes import Payload
from ..jobtypes.target import display
from .notes import Note
from .record import JobRecord
from .status import JobStatus

if TYPE_CHECKING:
    from .queue import Queue


def retry_with(queue: Queue, job_id: str, payload: Payload) -> JobRecord:
    """The new pending job that retries the failed job ``job_id`` with ``payload`` (of the same
    type), keeping its priority, attempts allowed and timeout; raises InvalidPayload (a payload of
    another type, or one its type refuses), InvalidTransition (the job is not failed),
    Superseded or AlreadyRetried, and then nothing is stored."""
    failed = queue.get(job_id)
    if failed.status is not JobStatus.FAILED:
        raise InvalidTransition(job_id, failed.status.value, JobStatus.PENDING.value)
    job = queue.build(payload, priority=failed.priority, max_attempts=failed.max_attempts, timeout=failed.timeout)
    if job.type != failed.type:
        raise InvalidPayload(failed.type, [f"(payload): a {job.type} payload cannot retry a {failed.type} job"])
    result = queue.backend.transact(lambda cur: _insert_in(queue, cur, failed, job))
    queue.enqueuer.committed([result])
    job_made: JobRecord = result.job
    return job_made


def _insert_in(queue: Queue, cur: Any, failed: JobRecord, job: JobRecord) -> Any:
    """In one transaction: the failed job still failed, not superseded nor retried, then the new job."""
    now = queue.get(failed.id, cur=cur)
    if now.status is not JobStatus.FAILED:
        raise InvalidTransition(failed.id, now.status.value, JobStatus.PENDING.value)
    earlier = cur.scalar(queue.sql.RETRIED_AS, {"id": failed.id})
    if earlier is not None:  # asked first: it is also the newer job on the target, named better
        raise AlreadyRetried(failed.id, earlier)
    if failed.ordering_key is not None:
        newer = cur.scalar(queue.sql.NEWER_ON_TARGET, {"ordering_key": failed.ordering_key, "id": failed.id})
        if newer is not None:
            raise Superseded(failed.id, newer, display(failed.ordering_key))
    # The retry carries the failed job's tags and meta: what found the one finds the other.
    rows = cur.rows(queue.sql.NOTE_OF, {"id": failed.id})
    carried = Note(tuple(tag for _, tag in rows if tag is not None), rows[0][0] if rows else None, failed.id)
    [result] = queue.enqueuer.insert_all(cur, [job], {job.id: carried})
    if result.duplicate:  # an active job holds its idempotency key: that one is what runs
        raise DuplicateActiveJob(failed.id, result.id, job.idempotency_key or "")
    queue.wakeup.notify_in(cur)
    return result
