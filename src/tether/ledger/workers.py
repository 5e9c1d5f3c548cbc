"""The ledger's register of worker processes (``tether_workers``): a worker writes its row when
its loop starts, renews ``beat_at`` with every heartbeat (in the transaction that renews its
jobs' locks, ``reclaim.renew``) and marks it stopped when it stops. No claim reads or writes it.
``observe.workers`` reads it for ``tether workers`` and the web page."""

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


def register(queue: Queue, worker: str, threads: int) -> None:
    """Write ``worker``'s row (host, pid, threads, version, started now), and drop the rows of
    workers not heard of for ``FORGET_AFTER``."""

    def start_in(cur: Any) -> None:
        now = lock_time(queue, cur)
        row = {
            "id": worker,
            "host": socket.gethostname()[:128],
            "pid": os.getpid(),
            "threads": threads,
            "version": installed(),
            "now": now,
        }
        cur.execute(queue.sql.WORKER_FORGET, {"before": now - FORGET_AFTER})
        cur.execute(queue.sql.WORKER_START, row)

    queue.backend.transact(start_in)


def stopped(queue: Queue, worker: str) -> None:
    """Mark ``worker`` stopped: the page shows it stopped, not gone."""
    queue.backend.transact(lambda cur: cur.execute(queue.sql.WORKER_STOP, {"id": worker, "now": lock_time(queue, cur)}))
