"""The worker's supervisor: shutdown (signals, the grace period, cancelling running jobs),
heartbeats that keep running jobs' locks, the stale-lock sweep, and the ledger fault that stops
the worker."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .. import events
from ..errors import LedgerFault
from ..jobtypes.context import LEASE_LOST, SHUTDOWN
from ..ledger import faults, workers
from ..ledger.backend import LostConnection
from ..ledger.record import JobRecord
from . import cancels

if TYPE_CHECKING:
    from ..ledger.queue import Queue
    from .executor import Executor
    from .loop import WorkerConfig
    from .producer import Producer


class Supervisor:
    """Watches over one worker's threads. ``stopping`` is set once no more jobs are to be
    claimed; ``cancel`` once running jobs are to stop at their next checkpoint."""

    def __init__(
        self,
        queue: Queue,
        config: WorkerConfig,
        worker_id: str,
        stopping: threading.Event,
        producer: Producer,
        executor: Executor,
    ) -> None:
        self.queue = queue
        self.config = config
        self.worker_id = worker_id
        self.stopping = stopping
        self.cancel = executor.cancel
        self.producer = producer
        self.executor = executor
        self.fault: LedgerFault | None = None  # what stopped this worker, if the ledger did
        self._grace_ends: float | None = None  # monotonic: when running jobs are cancelled
        self._last_beat = time.monotonic()
        self._listed = False

    # -- shutdown ----------------------------------------------------------------------------

    def stop(self, *, cancel: bool = False) -> None:
        """Stop claiming; running jobs have ``shutdown_grace`` seconds to finish. With ``cancel``
        (or once the grace is over) they are cancelled: they stop at their next checkpoint and
        give their attempt back (an assistant's process group is terminated at once)."""
        self.stopping.set()
        grace = self.config.shutdown_grace
        if not cancel and self._grace_ends is None and grace is not None:
            self._grace_ends = time.monotonic() + grace
        if cancel:
            self.cancel.set()
            self.executor.cancel_running(SHUTDOWN)
        self.producer.wake()

    def end_grace_once(self, now: float | None = None) -> bool:
        """Cancel the running jobs if the shutdown grace is over at ``now`` (monotonic seconds);
        returns whether it did. The supervising loop calls it on every turn."""
        ends = self._grace_ends
        if ends is None or self.cancel.is_set() or (time.monotonic() if now is None else now) < ends:
            return False
        running = len(self.executor.running())
        events.emit(
            "shutdown", worker=self.worker_id, mode="cancel running jobs", reason="grace period over", running=running
        )
        self.stop(cancel=True)
        return True

    @contextmanager
    def signals(self, install: bool) -> Iterator[None]:
        """SIGINT/SIGTERM stop this worker while it runs; the application's own handlers are
        put back afterwards."""
        if not install or threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self.stopping.is_set():  # the second: no more waiting
                events.emit(
                    "shutdown", worker=self.worker_id, signal=name, mode="cancel running jobs", reason="second signal"
                )
                self.stop(cancel=True)
                return
            grace = self.config.shutdown_grace
            events.emit("shutdown", worker=self.worker_id, signal=name, mode="finish running jobs", grace_seconds=grace)
            self.stop()

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # -- the register of workers ----------------------------------------------------------------

    def register(self) -> dict[str, int]:
        """This worker's row in the ledger's register of workers (its heartbeats renew it); returns
        the waiting jobs it lacks the types of, read in the same transaction. A ledger fault stops
        the worker here; another database error is logged and the worker runs unlisted, as a page
        is no reason to refuse work (and has nothing to say of those jobs)."""
        try:
            unserved = workers.register(self.queue, self.worker_id, self.config.threads)
            self._listed = True
            return unserved
        except sa.exc.SQLAlchemyError as e:
            if self.fatal(e):
                raise self.fault from e  # type: ignore[misc]
            self.db_error(e, step="register")
            return {}

    def unregister(self, *, unserved: bool = False) -> dict[str, int]:
        """Mark this worker stopped; with ``unserved``, returns the waiting jobs it lacks the types
        of, read in the same transaction. An error is only logged: the worker is stopping anyway."""
        if self.fault is not None:
            return {}
        try:
            return workers.stopped(self.queue, self.worker_id, unserved=unserved)
        except sa.exc.SQLAlchemyError as e:
            self.db_error(e, step="unregister")
            return {}

    # -- locks: heartbeats and the sweep -------------------------------------------------------

    def heartbeat_once(self, now: datetime | None = None) -> list[str]:
        """Renew the locks of the jobs this worker is running; log and cancel any it has lost.
        A job whose outcome was recorded between the read of the running jobs and the renewal is
        not lost: the recording judges its fence."""
        if not self._listed:  # its registration failed: the heartbeats try again
            self.register()
        running = self.executor.running()
        missed = self.queue.heartbeat(self.worker_id, [ctx.job for ctx in running], now=now)
        lost = self.executor.lost(missed)
        for ctx in lost:
            self.queue.emit_lost(ctx.job, self.worker_id)
            ctx.cancel(LEASE_LOST)
        return [ctx.job.id for ctx in lost]

    def beat_quietly(self) -> None:
        """A heartbeat; when none has succeeded for half the lock timeout, this worker can no
        longer be sure its locks hold, so its running jobs stop at their next checkpoint."""
        try:
            self.heartbeat_once()
            self._last_beat = time.monotonic()
        except sa.exc.SQLAlchemyError as e:
            if self.fatal(e):
                return
            self.db_error(e)
            if time.monotonic() - self._last_beat > self.config.lock_timeout / 2:
                self.executor.cancel_running(LEASE_LOST)

    def watch_once(self) -> list[str]:
        """Cancel the running jobs an operator asked to cancel (worker/cancels.py); their ids."""
        return cancels.watch_once(self.queue, self.executor, self.worker_id)

    def watch_quietly(self) -> None:
        """``watch_once``; a database error is logged and the next turn asks again."""
        try:
            self.watch_once()
        except sa.exc.SQLAlchemyError as e:
            if not self.fatal(e):
                self.db_error(e)

    def sweep_once(self, now: datetime | None = None) -> list[JobRecord]:
        """Give back (or fail) the jobs whose locks went stale: their workers died."""
        return self.queue.reclaim_stale(self.config.lock_timeout, now=now)

    def supervise(self, threads: list[threading.Thread], until_idle: bool) -> None:
        """Heartbeats and sweeps while the claiming threads run."""
        next_beat = time.monotonic() + self.config.heartbeat_every
        next_sweep = time.monotonic() + self.config.sweep_every
        next_watch = time.monotonic() + cancels.WATCH_EVERY
        while any(t.is_alive() for t in threads):
            threads[0].join(timeout=min(0.2, self.config.heartbeat_every))
            self.end_grace_once()
            if self.fault is None:
                self.fatal(self.queue.backend.file_fault())
            now = time.monotonic()
            if now >= next_watch:
                self.watch_quietly()
                next_watch = now + cancels.WATCH_EVERY
            if now >= next_beat:
                self.beat_quietly()
                next_beat = now + self.config.heartbeat_every
            if now >= next_sweep and not until_idle:
                try:
                    self.sweep_once()
                except sa.exc.SQLAlchemyError as e:
                    if not self.fatal(e):
                        self.db_error(e)
                next_sweep = now + self.config.sweep_every

    def join(self, threads: list[threading.Thread]) -> None:
        """Cancel and wait for threads still running (left by an exception: a KeyboardInterrupt
        an application catches), beating meanwhile: never leave threads running jobs without
        heartbeats."""
        if not any(t.is_alive() for t in threads):
            return
        self.stop(cancel=True)
        for t in threads:
            while t.is_alive():
                t.join(timeout=min(1.0, self.config.heartbeat_every))
                self.beat_quietly()

    # -- database errors -----------------------------------------------------------------------

    def fatal(self, error: BaseException | None) -> bool:
        """Whether ``error`` is a ledger fault (``tether.ledger.faults``). The first one stops this
        worker: running jobs are cancelled at their next checkpoint, and what it holds is given
        back where the ledger still takes a write; ``run`` then raises it."""
        if error is None:
            return False
        if self.fault is not None:
            return faults.kind_of(error) is not None
        fault = faults.ledger_fault(error, self.queue.where)
        if fault is None:
            # The statement may have failed because the file under it went away.
            fault = self.queue.backend.file_fault()
            if fault is None:
                return False
        self.fault = fault
        events.emit("ledger_fault", worker=self.worker_id, fault=fault.kind, error=str(fault))
        self.stop(cancel=True)
        return True

    def db_error(self, error: BaseException, **fields: Any) -> None:
        """The event of a database error a loop retries after; a lost connection had its own
        (``connection_lost``) where it was met, and one drop costs one line."""
        if not isinstance(error, LostConnection):
            events.emit("db_error", worker=self.worker_id, error=faults.describe(error), **fields)

    def next_backoff(self, current: float) -> float:
        """The wait before retrying after a database error: doubling from the poll interval,
        at most ``max_db_backoff``."""
        return min(self.config.max_db_backoff, max(self.config.poll_interval, current * 2))
