"""The worker's producer: claims batches of jobs, sizes them to how fast jobs run and how
contended the write lock is, fires due periodic jobs before each claim, and waits for wake-ups
when nothing is ready."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from ..clock import elapsed
from ..ledger.record import JobRecord

if TYPE_CHECKING:
    from ..ledger.queue import Queue
    from .loop import WorkerConfig
    from .schedule import Scheduler


@dataclass(slots=True)
class Claimed:
    """Jobs one statement claimed, and when (``clock.elapsed()``) that statement started."""

    jobs: list[JobRecord] = field(default_factory=list)
    leased_at: float = 0.0


class Producer:
    """Claims for one worker's threads. A claim takes ``batch`` jobs while jobs are fast, more
    while the write lock is contended (``adapt``), one at a time once jobs were slow."""

    def __init__(
        self, queue: Queue, config: WorkerConfig, worker_id: str, stopping: threading.Event, scheduler: Scheduler | None
    ) -> None:
        self.queue = queue
        self.config = config
        self.worker_id = worker_id
        self.stopping = stopping
        self.scheduler = scheduler  # enqueues due periodic jobs before each claim (schedule.py)
        self.slow = False  # the last batch's jobs were slow (WorkerConfig.slow_job): claims go one at a time
        self._limit = config.batch  # jobs the next claim takes while jobs are fast (see adapt)
        self._batch_took = float("inf")  # seconds the last batch took to run (none yet: unknown)
        # Until-idle bookkeeping shared by the threads: how many are inside a batch, and whether
        # one found nothing ready while none was (then no job can become ready: all stop).
        self.idle = threading.Condition()
        self.busy = 0
        self.drained = False

    def fire_schedules(self, now: datetime | None = None) -> None:
        """Enqueue the periodic jobs now due (one indexed query when none is), before claiming."""
        if self.scheduler is not None:
            self.scheduler.tick(now)

    def claim(self, now: datetime | None = None) -> Claimed:
        """Claim the next batch (as of ``now``) in a transaction of its own."""
        leased_at = elapsed()
        waits = self.queue.backend.lock_waits
        jobs = self.queue.claim(self.worker_id, now=now, limit=self.claim_limit(), max_bytes=self.config.batch_bytes)
        self.adapt(self.queue.backend.lock_waits != waits)
        return Claimed(jobs, leased_at)

    def claim_in(self, commit: Callable[[int], list[JobRecord]], ahead: bool) -> Claimed:
        """The next batch claimed in the transaction ``commit`` makes (given how many jobs to
        claim: none unless ``ahead``), which records the last batch's outcomes."""
        leased_at = elapsed()
        return Claimed(commit(self.claim_limit() if ahead else 0), leased_at)

    def claim_limit(self) -> int:
        return 1 if self.slow else self._limit

    def adapt(self, waited: bool) -> None:
        """After a claiming transaction: a claim that waited for the write lock while the last
        batch ran quickly (well within a group commit's window) doubles the next claim, up to
        ``max_batch``; one that did not wait halves it, down to ``batch``. Slow jobs never grow
        it, so no worker sits on many jobs while other workers could run them."""
        config = self.config
        if waited and self._batch_took * 2 <= config.flush_after:
            self._limit = min(self._limit * 2, max(config.batch, config.max_batch))
        elif not waited and self._limit > config.batch:
            self._limit = max(self._limit // 2, config.batch)

    def ran(self, took: float | None, slow: bool) -> None:
        """What the last batch showed: how long it took to run whole (None: it did not finish)
        and whether its jobs were slow."""
        if took is not None:
            self._batch_took = took
        self.slow = slow

    def trusted_until(self, batch: Claimed) -> float | None:
        """Until when (``clock.elapsed()``) the batch's jobs are known to be this worker's without
        asking the ledger. No other worker takes these locks before they are lock_timeout old; for
        the first half of that the claim is proof enough (the margin heartbeat self-fencing keeps
        too), as long as every worker counts time on one machine's clocks. A worker on another
        machine may have been paused in a way its own counters do not see (a paused VM) while the
        others went on: there (None) the ledger is asked before every effect."""
        if not self.queue.backend.one_machine:
            return None
        return batch.leased_at + self.config.lock_timeout / 2

    def wait_for_work(self, seen: int, until_idle: bool) -> bool:
        """After a claim found nothing: False when this thread is done (until idle, and no other
        thread is running a job that could make one ready); otherwise wait for a wake-up (an
        enqueue, a commit by another process) or the poll interval, and True."""
        if not until_idle:
            self.queue.wakeup.wait(seen, self.config.poll_interval)
            return True
        with self.idle:
            if self.busy == 0:
                self.drained = True
                self.idle.notify_all()
                return False
            self.idle.wait_for(lambda: self.busy == 0 or self.drained or self.stopping.is_set())
        return True

    def wake(self) -> None:
        """Wake every thread waiting for work (the worker is stopping)."""
        self.queue.wakeup.wake_local()
        with self.idle:
            self.idle.notify_all()
