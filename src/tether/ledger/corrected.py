"""A retry with a corrected payload: a new job, validated as any enqueue, linked to the failed one
(``retry_of``). The failed job and its payload stay as they are, as evidence of what was asked
and why it failed; ``tether show`` names each from the other.

The order per target holds as for a plain retry (``Queue.manual_retry``): once a newer job on the
failed job's target is queued or done, a retry would undo it, so it is refused (Superseded). A
failed job is retried with a corrected payload once: a second one is refused, naming the first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import DuplicateActiveJob, InvalidPayload, InvalidTransition, Superseded, TetherError
from ..jobtypes import Payload
from ..jobtypes.target import display
from .notes import Note
from .record import JobRecord
from .status import JobStatus

if TYPE_CHECKING:
    from .queue import Queue


class AlreadyRetried(TetherError):
    """A failed job was already retried with a corrected payload: look at that job (``tether
    show``), and retry it instead if it failed too."""

    def __init__(self, job_id: str, retry_id: str) -> None:
        super().__init__(
            f"job {job_id} was already retried with a corrected payload as job {retry_id}; "
            f"see tether show {retry_id}, and retry that one if it failed too"
        )


def retry_with(queue: Queue, job_id: str, payload: Payload) -> JobRecord:
    """The new pending job that retries the failed job ``job_id`` with ``payload`` (of the same
    type), keeping its priority, attempts allowed and timeout; raises InvalidPayload (a payload of
    another type, or one its type refuses), InvalidTransition (the job is not failed),
    Superseded or AlreadyRetried, and then nothing is stored."""
    failed = queue.get(job_id)
    if failed.status is not JobStatus.FAILED:
        raise InvalidTransition(job_id, failed.status.value, JobStatus.PENDING.value)
    if payload.job_type != failed.type:
        raise InvalidPayload(failed.type, [f"(payload): a {payload.job_type} payload cannot retry a {failed.type} job"])
    job = queue.build(payload, priority=failed.priority, max_attempts=failed.max_attempts, timeout=failed.timeout)
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
    [result] = queue.enqueuer.insert_all(cur, [job], {job.id: Note(retry_of=failed.id)})
    if result.duplicate:  # an active job holds its idempotency key: that one is what runs
        raise DuplicateActiveJob(failed.id, result.id, job.idempotency_key or "")
    queue.wakeup.notify_in(cur)
    return result
