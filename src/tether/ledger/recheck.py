"""A worker's group commit whose answer was lost: read from the ledger whether it landed.

When the connection dies during COMMIT (``backend.LostCommit``), the server may have committed
the transaction or not; nothing the client holds can tell. A transaction commits whole or not at
all, so the jobs' rows tell for the whole group: a job still held by this worker for the attempt
decided on means the commit did not land, and the group is recorded again, fenced as always. No
job so held means it landed: nothing is recorded again, and each job's event is logged as after
a commit seen to succeed. Recording again blindly would be wrong where it matters most: a job a
landed commit released (or deferred) gave its attempt back, may have been claimed anew by this
same worker with the same attempt number, and would pass the fence a second time: a job that is
running would be given back. The claim's time tells the two claims apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import events
from .record import InsertResult, make_tuple
from .status import ENDING, TRANSITIONS

if TYPE_CHECKING:
    from .queue import Decision, Queue


def unsettled(queue: Queue, worker: str, decisions: Sequence[Decision]) -> list[Decision]:
    """The decisions of ``worker``'s lost group commit still to record: all of them if it did not
    land, none if it did (their events logged here). One ``commit_rechecked`` event says which."""
    with queue.backend.read() as cur:
        standing = [
            cur.rows(
                queue.sql.STANDING,
                {"id": d.job.id, "worker": worker, "attempt": d.job.attempts, "claimed_at": d.job.claimed_at},
            )
            for d in decisions
        ]
    landed = not any(rows and rows[0][1] for rows in standing)
    events.emit("commit_rechecked", worker=worker, jobs=len(decisions), landed=landed)
    if not landed:
        return list(decisions)
    children: list[InsertResult] = []
    for d, rows in zip(decisions, standing, strict=True):
        status = rows[0][0] if rows else None
        if d.edge in ENDING and status != TRANSITIONS[d.edge][1].value:
            queue._lost(d.job, worker)  # its lock was reclaimed before the commit: it did not move
            continue
        queue._event(d.edge, d.after(), worker, duration=d.duration)
        children += [make_tuple(InsertResult, (child, False)) for child in d.children]
    queue.committed(children)
    queue.wakeup.wake_local()
    return []
