"""The ledger's register of worker processes (``tether_workers``): a worker writes its row when
its loop starts, renews ``beat_at`` with every heartbeat (in the transaction that renews its
jobs' locks, ``reclaim.renew``) and marks it stopped when it stops. No claim reads or writes it.
``observe.workers`` reads it for ``tether workers`` and the web page.

A start and a stop each make one transaction, which also reads what the worker says then: the
waiting jobs whose types it lacks (``Queue.pending_unserved``). Its commit does not wait for the
disk (``Backend.transact_unsynced``): the register informs and decides nothing, and the worker's
next durable commit (a claim, a heartbeat) makes it durable too, where a synced commit would cost
each start and stop a disk flush."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..version import installed
from .reclaim import lock_time

if TYPE_CHECKING:
    from .queue import Queue

FORGET_AFTER = timedelta(days=1)
"""A worker not heard of for this long (stopped or dead) is dropped when another one starts."""


def register(queue: Queue, worker: str, threads: int) -> dict[str, int]:
    """Write ``worker``'s row (host, pid, threads, version, started now), and drop the rows of
    workers not heard of for ``FORGET_AFTER``; returns the waiting jobs ``queue``'s registry
    lacks the types of, by type."""

    def start_in(cur: Any) -> dict[str, int]:
        now = lock_time(queue, cur)
        row = {
            "id": worker,
            "host": socket.gethostname()[:128],
            "pid": os.getpid(),
            "threads": threads,
            "version": installed(),
            "now": now,
        }
        cur.send(queue.sql.WORKER_FORGET, {"before": now - FORGET_AFTER})
        cur.send(queue.sql.WORKER_START, row)
        return queue.pending_unserved(cur=cur)

    return queue.backend.transact_unsynced(start_in, pipelined=True)


def stopped(queue: Queue, worker: str, *, unserved: bool = False) -> dict[str, int]:
    """Mark ``worker`` stopped: the page shows it stopped, not gone. With ``unserved``, returns
    the waiting jobs ``queue``'s registry lacks the types of, by type (else nothing)."""

    def stop_in(cur: Any) -> dict[str, int]:
        cur.send(queue.sql.WORKER_STOP, {"id": worker, "now": lock_time(queue, cur)})
        return queue.pending_unserved(cur=cur) if unserved else {}

    return queue.backend.transact_unsynced(stop_in, pipelined=True)
