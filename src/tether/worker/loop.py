"""The worker: one composition of its parts, and the loop each of its threads runs.

A thread claims a batch (``producer``), runs its jobs in order (``executor``), decides each
outcome and records them in group commits (``completer``); the thread that called ``run``
supervises them (``supervisor``: signals, grace, heartbeats, the stale-lock sweep, ledger faults).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa

from .. import config, events, tracing
from ..errors import LedgerFault
from ..jobtypes.context import JobContext
from ..jobtypes.datafiles.dirsync import DirSyncs
from ..ledger.engine import ledger_url, schema_of
from ..ledger.lifecycle import Decision
from ..ledger.record import JobRecord
from ..ledger.walwatch import WalWatcher
from .completer import NOT_RUN, Completer, Outcome, Stopped
from .executor import Executor, Returned
from .producer import Claimed, Producer
from .retry import RetryPolicy
from .supervisor import Supervisor

if TYPE_CHECKING:
    from ..ledger.queue import Queue
    from .schedule import Scheduler


@dataclass
class WorkerConfig:
    """How a worker runs. By default it polls every second, and a lock goes stale after five
    minutes without a heartbeat."""

    threads: int = 1
    poll_interval: float = 1.0
    lock_timeout: float = config.DEFAULT_LOCK_TIMEOUT
    heartbeat_interval: float | None = None  # default: lock_timeout / 4
    sweep_interval: float | None = None  # default: min(60, lock_timeout / 2)
    max_db_backoff: float = 30.0
    batch: int = 100  # jobs claimed per transaction while jobs are fast (River fetches 100 too)
    max_batch: int = 800
    """Jobs claimed per transaction while fast jobs' claims wait for a contended write lock
    (SQLite, several worker processes): the batch doubles up to this, and halves back to
    ``batch`` once the lock is free. Each transaction's fixed cost (the lock's hand-over, the
    commit) is then shared by more jobs, so that adding processes does not lower the drain rate
    (benchmarks/README.md, ``procs.py``)."""
    batch_bytes: int = config.DEFAULT_BATCH_BYTES  # payload claimed per transaction (or one larger job)
    flush_after: float = 0.1
    """Longest a finished job waits for its group commit (s). Wide enough that a whole batch of
    file jobs on a local disk ends inside it: a batch that overran it by a few jobs paid a second
    commit, and its directories' fsyncs, for those few (benchmarks/README.md)."""
    slow_job: float = 0.01
    """Once a batch's handlers have taken longer than this (s) a job on average, its jobs not yet
    started go back and claims go one at a time. The mean, not each job: one fsync that stalls
    among fast jobs says nothing of the jobs after it, and giving them back costs a release and a
    claim each."""
    shutdown_grace: float | None = config.DEFAULT_SHUTDOWN_GRACE
    """Seconds running jobs get to finish after the first shutdown signal (or ``stop()``); then
    they are cancelled at their next checkpoint and give their attempt back, as a second signal
    does at once. None: no limit."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_snoozes: int = 100
    """Snoozes a job may take (a handler's ``Snooze``, a rate limit's hold; a full data root is not
    counted): each gives its attempt back, so without a cap a job that always snoozes never ends.
    The one after the last fails the job (``SnoozedTooOften``)."""

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat_interval or self.lock_timeout / 4

    @property
    def sweep_every(self) -> float:
        return self.sweep_interval or min(60.0, self.lock_timeout / 2)


@dataclass(slots=True)
class _Progress:
    """What a batch has come to so far, kept when a handler's thread is interrupted."""

    pending: list[Decision] = field(default_factory=list)  # decided, not yet recorded
    ran: int = 0
    took: float = 0.0  # seconds the handlers run so far took, together
    slow: bool = False
    edges: Counter[str] = field(default_factory=Counter)


class Worker:
    """Runs jobs from one queue. ``run()`` until a signal; ``run_until_idle()`` for scripts;
    ``run_once(now)`` for tests that drive a single iteration at a fixed time."""

    def __init__(
        self,
        queue: Queue,
        config: WorkerConfig | None = None,
        *,
        worker_id: str | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.queue = queue
        self.config = config or WorkerConfig()
        # host:pid:random, within locked_by's 128 characters however long the host name is
        self.id = worker_id or f"{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(3)}"
        stopping = threading.Event()
        self.producer = Producer(queue, self.config, self.id, stopping, scheduler)
        self.executor = Executor(queue, self.id, threading.Event())
        self.supervisor = Supervisor(queue, self.config, self.id, stopping, self.producer, self.executor)
        self.completer = Completer(queue, self.config, self.producer, self.supervisor)
        self.on_unserved: Callable[[dict[str, int]], None] | None = None
        """Called with the pending jobs this worker lacks the types of, whenever it reports them
        (``tether worker`` prints them on stderr, which ``-q`` leaves)."""
        self.processed = 0
        self._worked = False  # ran a job since it last ran out of work (_report_unserved)
        self.outcomes: Counter[str] = Counter()  # handlers run, by edge: complete, retry, fail, release
        self._tally = threading.Lock()  # the threads' counts

    @property
    def fault(self) -> LedgerFault | None:
        """What stopped this worker, if the ledger did."""
        return self.supervisor.fault

    # -- single steps ------------------------------------------------------------------------

    def run_once(self, now: datetime | None = None, *, claim_at: datetime | None = None) -> int:
        """One tick: fire the schedules due at ``now``, claim ready jobs (as of ``claim_at``, else
        ``now``; up to ``batch``, or one while jobs are slow), run them in order, record their
        outcomes in group commits. Returns jobs run; LedgerFault if the ledger is corrupt, full,
        read-only or gone."""
        try:
            self.producer.fire_schedules(now)
            ran = self._run_batch(self.producer.claim(claim_at or now), claim_next=False)[0]
        except sa.exc.SQLAlchemyError as e:
            self.supervisor.fatal(e)
            raise
        if self.fault is not None:
            raise self.fault
        return ran

    def heartbeat_once(self, now: datetime | None = None) -> list[str]:
        """Renew the locks of the jobs this worker is running; cancel any it has lost."""
        return self.supervisor.heartbeat_once(now)

    def sweep_once(self, now: datetime | None = None) -> list[JobRecord]:
        """Give back (or fail) the jobs whose locks went stale."""
        return self.supervisor.sweep_once(now)

    def unserved(self) -> dict[str, int]:
        """Pending jobs of the types this worker has not registered, by type: it never claims them."""
        return self.queue.pending_unserved()

    def _report_unserved(self, unserved: dict[str, int] | None = None) -> None:
        """An event naming the pending jobs this worker leaves waiting because it lacks their
        types (started without the module that registers them), when there are any: those given
        (read with the register's row at start and stop), else read now. A database error here
        skips the remark: the claim meets the same error and handles it."""
        if unserved is None:
            try:
                unserved = self.unserved()
            except sa.exc.SQLAlchemyError:
                return
        if unserved:
            events.emit(
                "types_not_registered",
                worker=self.id,
                pending=sum(unserved.values()),
                types=unserved,
                hint="start the worker with --import MODULE (Python: coordinator.register)",
            )
            if self.on_unserved is not None:
                with contextlib.suppress(Exception):  # a remark: a broken stream must not stop a thread
                    self.on_unserved(unserved)

    def stop(self, *, cancel: bool = False) -> None:
        """Stop claiming; running jobs have ``shutdown_grace`` seconds to finish. With ``cancel``
        (or once the grace is over) they are cancelled: they stop at their next checkpoint and
        give their attempt back (an assistant's process group is terminated at once)."""
        self.supervisor.stop(cancel=cancel)

    # -- loops -------------------------------------------------------------------------------

    def run_until_idle(self, *, install_signals: bool = True) -> int:
        """Sweep stale locks, then run jobs until none is ready; returns how many ran. Signals
        stop it as they stop ``run()``."""
        with self.supervisor.signals(install_signals):
            try:
                self.sweep_once()
            except sa.exc.SQLAlchemyError as e:
                if self.supervisor.fatal(e):
                    raise self.fault from e  # type: ignore[misc]
                raise
            return self._run(until_idle=True)

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped (SIGINT/SIGTERM when ``install_signals``); returns jobs run. Raises
        LedgerFault, once its threads have stopped, if the ledger is corrupt, full, read-only or
        gone (``tether.ledger.faults``); other database errors are retried with backoff."""
        with self.supervisor.signals(install_signals):
            return self._run(until_idle=False)

    def _run(self, *, until_idle: bool) -> int:
        start_count = self.processed
        self.producer.drained = False
        events.emit(
            "worker_started",
            worker=self.id,
            threads=self.config.threads,
            until_idle=until_idle,
            ledger=ledger_url(self.queue.engine),
            schema=schema_of(self.queue.engine),
            root=str(self.queue.root),
        )
        self._report_unserved(self.supervisor.register())
        # The tracing API, where installed, is imported now: in the first batch its import would
        # hold up the jobs claimed with it, and a burst's first claims are most of a short drain.
        tracing.attempt_tracer()
        threads = [
            threading.Thread(target=self._loop, args=(until_idle,), name=f"tether-worker-{i}", daemon=True)
            for i in range(self.config.threads)
        ]
        watcher = None
        database = self.queue.engine.url.database
        if not until_idle and self.queue.backend.name == "sqlite" and database:  # not in-memory
            watcher = WalWatcher(database, self.queue.wakeup).start()
        for t in threads:
            t.start()
        try:
            self.supervisor.supervise(threads, until_idle)
        finally:
            self.supervisor.join(threads)
            if watcher is not None:
                watcher.stop()
            left = self.supervisor.unregister(unserved=until_idle)
        fault = self.fault
        if until_idle and fault is None:
            self._report_unserved(left)
        events.emit(
            "worker_stopped",
            worker=self.id,
            processed=self.processed - start_count,
            fault=None if fault is None else fault.kind,
        )
        if fault is not None:
            raise fault
        return self.processed - start_count

    def _loop(self, until_idle: bool) -> None:
        # Jobs claimed in the commit that recorded the last batch: taken back if the loop ends
        # before they run, so none waits for the stale sweep.
        carried = Claimed()
        try:
            self._loop_claiming(until_idle, carried)
        finally:
            try:
                if carried.jobs:
                    self.completer.record([self.completer.decide(job, NOT_RUN) for job in carried.jobs])
            finally:
                self.queue.backend.thread_done()

    def _loop_claiming(self, until_idle: bool, carried: Claimed) -> None:
        producer, supervisor = self.producer, self.supervisor
        backoff = 0.0
        while not producer.stopping.is_set():
            seen = self.queue.wakeup.generation()
            with producer.idle:
                if producer.drained and not carried.jobs:
                    return
                producer.busy += 1
            try:
                producer.fire_schedules()
                batch = Claimed(carried.jobs, carried.leased_at) if carried.jobs else producer.claim()
                carried.jobs = []
                ran, following = self._run_batch(batch, claim_next=True)
                carried.jobs, carried.leased_at = following.jobs, following.leased_at
                backoff = 0.0
            except sa.exc.SQLAlchemyError as e:
                if supervisor.fatal(e):
                    return
                backoff = supervisor.next_backoff(backoff)
                supervisor.db_error(e, retry_in=backoff)
                ran = -1
            finally:
                with producer.idle:
                    producer.busy -= 1
                    producer.idle.notify_all()
            if ran > 0:
                self._worked = True
                continue
            if ran < 0:
                producer.stopping.wait(backoff)
                continue
            if self._worked and not until_idle:  # out of work: the threads share the flag
                self._worked = False
                self._report_unserved()
            if not producer.wait_for_work(seen, until_idle):
                return

    # -- one batch ---------------------------------------------------------------------------

    def _run_batch(self, batch: Claimed, *, claim_next: bool) -> tuple[int, Claimed]:
        """Run a claimed batch in order; returns how many ran and, with ``claim_next``, the batch
        claimed in the commit that recorded this one's last outcomes."""
        jobs = batch.jobs
        if not jobs:
            return 0, Claimed()
        syncs = DirSyncs()  # directory fsyncs shared by the jobs of each group commit (dirsync.py)
        contexts = self.executor.start(jobs, self.producer.trusted_until(batch), syncs)
        progress = _Progress()
        following = Claimed()
        took = None
        try:
            started = time.perf_counter()
            self._run_jobs(jobs, contexts, syncs, progress)
            took = time.perf_counter() - started
        except BaseException:
            # Leave nothing claimed without a heartbeat: unstarted jobs go back at once.
            done = {d.job.id for d in progress.pending}
            decide = self.completer.decide
            progress.pending += [decide(j, NOT_RUN) for j in jobs[progress.ran :] if j.id not in done]
            raise
        finally:
            self.producer.ran(took, progress.slow)
            pending = self.completer.synced(progress.pending, syncs.close())
            if pending:
                ahead = claim_next and took is not None and not self.producer.stopping.is_set()
                following = self.producer.claim_in(lambda claim: self._record(pending, claim), ahead)
            self.executor.done(jobs)
            with self._tally:
                self.outcomes.update(progress.edges)
                self.processed += progress.ran
        return progress.ran, following

    def _record(self, decisions: list[Decision], claim: int = 0) -> list[JobRecord]:
        """Record ``decisions`` in one group commit (taking ``claim`` more jobs in it); from here
        their fences are the completer's to judge, not the heartbeat's."""
        self.executor.settling([d.job.id for d in decisions])
        return self.completer.record(decisions, claim=claim)

    def _run_jobs(
        self, jobs: Sequence[JobRecord], contexts: list[JobContext], syncs: DirSyncs, progress: _Progress
    ) -> None:
        """Run ``jobs`` in order, deciding each. The outcomes wait for one group commit, made
        before the next handler (which may be slow) once the first of them has waited
        ``flush_after``. Once stopping, or once the jobs run were slow (``slow_job``), the jobs not
        yet started go back untouched, for any worker to take."""
        completer, stopping, config = self.completer, self.producer.stopping, self.config
        decide, attempt, queue, worker = completer.decide, self._attempt, self.queue, self.id
        pending = progress.pending
        flush_at = 0.0
        tracer = tracing.attempt_tracer()
        for job, ctx in zip(jobs, contexts, strict=True):
            if (stopping.is_set() and progress.ran) or progress.slow:
                pending.append(decide(job, NOT_RUN))
                continue
            if ctx.cancel_note is not None:  # cancelled by an operator before its handler started
                pending.append(decide(job, Stopped(ctx.cancel_note)))
                continue
            if pending and time.perf_counter() >= flush_at:
                self._record(completer.synced(pending, syncs.flush()))
                pending = progress.pending = []
            decision = tracing.attempt(tracer, queue, job, worker, attempt, ctx)
            pending.append(decision)
            progress.edges[decision.edge] += 1
            progress.ran += 1
            if len(pending) == 1:
                flush_at = time.perf_counter() + config.flush_after
            progress.took += decision.duration or 0.0
            progress.slow = progress.took > config.slow_job * progress.ran

    def _attempt(self, job: JobRecord, ctx: JobContext) -> tuple[Decision, Outcome]:
        """Run ``job``'s handler and decide what the attempt comes to (its span, if any, is
        current meanwhile): the decision, and the outcome it was made from."""
        outcome: Outcome
        outcome, duration = self.executor.run(job, ctx)
        if ctx.cancel_note is not None and not isinstance(outcome, Returned):
            # An operator's cancel decides how an attempt that did not complete ends; a handler
            # that returned has done its work, and its completion is the truth the data root and
            # reconcile will show.
            outcome = Stopped(ctx.cancel_note)
        return self.completer.decide(job, outcome, duration), outcome
