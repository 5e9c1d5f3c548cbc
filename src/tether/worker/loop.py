"""The worker: claim, run the handler, report the outcome; heartbeats, sweeps, shutdown."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from .. import config, events
from ..clock import elapsed
from ..errors import Cancelled, Deferred, InvalidPayload, JobTimedOut, LedgerFault, PermanentError, StorageFull
from ..jobtypes.context import LEASE_LOST, SHUTDOWN, TIMEOUT, JobContext
from ..jobtypes.datafiles.dirsync import DirSyncs
from ..jobtypes.datafiles.effects import file_error
from ..ledger import faults
from ..ledger.backend import LostCommit, LostConnection
from ..ledger.queue import Decision
from ..ledger.recheck import unsettled
from ..ledger.record import JobRecord
from ..ledger.walwatch import WalWatcher
from ..outcome import encode_result, error_text
from .retry import RetryPolicy

if TYPE_CHECKING:
    from ..jobtypes import JobType, Payload
    from ..ledger.queue import Queue
    from ..schedule import Scheduler


# The longest a job waits for space on a full data root before it tries again.
STORAGE_WAIT = timedelta(seconds=60)


@dataclass
class WorkerConfig:
    """How a worker runs. Defaults follow the spec: 1 s poll, 5 min lock timeout."""

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
    """Longest a finished job waits for its group commit (s). Wide enough that a batch of file
    jobs (about 0.5 ms each on an SSD) ends inside it: a batch that overran it by a few jobs paid
    a second commit, and its directories' fsyncs, for those few (benchmarks/README.md)."""
    slow_job: float = 0.01  # a job slower than this (s) gives its batch back; claims go one at a time
    shutdown_grace: float | None = config.DEFAULT_SHUTDOWN_GRACE
    """Seconds running jobs get to finish after the first shutdown signal (or ``stop()``); then
    they are cancelled at their next checkpoint and give their attempt back, as a second signal
    does at once. None: no limit."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat_interval or self.lock_timeout / 4

    @property
    def sweep_every(self) -> float:
        return self.sweep_interval or min(60.0, self.lock_timeout / 2)


@dataclass(slots=True)
class _Claimed:
    """Jobs one statement claimed, and when (monotonic) that statement started."""

    jobs: list[JobRecord] = field(default_factory=list)
    leased_at: float = 0.0


class Returned(NamedTuple):
    """The handler returned normally."""

    result: Any
    children: Sequence[JobRecord]


class Worker:
    """Runs jobs from one queue. ``run()`` until a signal; ``run_until_idle()`` for scripts;
    ``run_once(now)`` for tests that drive a single iteration at a fixed time."""

    def __init__(self, queue: Queue, config: WorkerConfig | None = None, *, worker_id: str | None = None) -> None:
        self.queue = queue
        self.config = config or WorkerConfig()
        # host:pid:random, within locked_by's 128 characters however long the host name is
        self.id = worker_id or f"{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(3)}"
        self._stopping = threading.Event()
        self._cancel = threading.Event()
        self._grace_ends: float | None = None  # monotonic: when running jobs are cancelled
        self._running: dict[str, JobContext] = {}  # by job id; ctx.job is the job
        self._running_lock = threading.Lock()
        self._idle = threading.Condition()
        self._busy = 0
        self._drained = False
        self.processed = 0
        self.outcomes: Counter[str] = Counter()  # handlers run, by edge: complete, retry, fail, release
        self.empty_polls = 0  # claims that found nothing ready
        self._slow = False
        self._full_streak = 0  # jobs in a row that met a full data root (see _storage_wait)
        self._limit = self.config.batch  # jobs the next claim takes while jobs are fast (see _adapt)
        self._batch_took = float("inf")  # seconds the last batch took to run (none yet: unknown)
        self._last_beat = time.monotonic()
        self.fault: LedgerFault | None = None  # what stopped this worker, if the ledger did
        self.scheduler: Scheduler | None = None  # enqueues due periodic jobs each poll (schedule.py)

    # -- single steps ------------------------------------------------------------------------

    def run_once(self, now: datetime | None = None) -> int:
        """One tick: claim ready jobs (as of ``now``; up to ``batch``, or one while jobs are
        slow), run them in order, record their outcomes in group commits. Returns jobs run;
        LedgerFault if the ledger is corrupt, full, read-only or gone."""
        try:
            self._fire_schedules(now)
            ran = self._run_batch(self._claim(now), claim_next=False)[0]
        except sa.exc.SQLAlchemyError as e:
            self._fatal(e)
            raise
        if self.fault is not None:
            raise self.fault
        return ran

    def _fire_schedules(self, now: datetime | None = None) -> None:
        """Enqueue the periodic jobs now due (one indexed query when none is), before claiming."""
        if self.scheduler is not None:
            self.scheduler.tick(now)

    def _claim(self, now: datetime | None = None) -> _Claimed:
        leased_at = elapsed()
        waits = self.queue.backend.lock_waits
        jobs = self.queue.claim(self.id, now=now, limit=self._claim_limit(), max_bytes=self.config.batch_bytes)
        self._adapt(self.queue.backend.lock_waits != waits)
        return _Claimed(jobs, leased_at)

    def _claim_limit(self) -> int:
        return 1 if self._slow else self._limit

    def _adapt(self, waited: bool) -> None:
        """After a claiming transaction: a claim that waited for the write lock while the last
        batch ran quickly (well within a group commit's window) doubles the next claim, up to
        ``max_batch``; one that did not wait halves it, down to ``batch``. Slow jobs never grow
        it, so no worker sits on many jobs while other workers could run them."""
        config = self.config
        if waited and self._batch_took * 2 <= config.flush_after:
            self._limit = min(self._limit * 2, max(config.batch, config.max_batch))
        elif not waited and self._limit > config.batch:
            self._limit = max(self._limit // 2, config.batch)

    def _run_batch(self, batch: _Claimed, *, claim_next: bool) -> tuple[int, _Claimed]:
        """Run a claimed batch in order; returns how many ran and, with ``claim_next``, the batch
        claimed in the commit that recorded this one's last outcomes."""
        jobs = batch.jobs
        if not jobs:
            return 0, _Claimed()
        trusted_until = self._trusted_until(batch)
        syncs = DirSyncs()  # directory fsyncs shared by the jobs of each group commit (dirsync.py)
        contexts = [
            JobContext(job, self.queue, self._cancel, self.id, trusted_until=trusted_until, dir_syncs=syncs)
            for job in jobs
        ]
        with self._running_lock:
            for job, ctx in zip(jobs, contexts, strict=True):
                self._running[job.id] = ctx
        pending: list[Decision] = []
        flush_at = 0.0
        ran = 0
        edges: Counter[str] = Counter()
        slow = False
        finished = False
        following = _Claimed()
        started = time.perf_counter()
        try:
            for job, ctx in zip(jobs, contexts, strict=True):
                if (self._stopping.is_set() and ran) or slow:
                    # Shutting down, or the batch turned out slow: the jobs not yet started go
                    # back untouched, for any worker to take.
                    pending.append(Decision.release(job))
                    continue
                if pending and time.perf_counter() >= flush_at:
                    self._record(self._synced(pending, syncs.flush()))  # before the next handler, which may be slow
                    pending = []
                outcome, duration = self._run_handler(job, ctx)
                pending.append(self._decide_safely(job, outcome, duration))
                edges[pending[-1].edge] += 1
                ran += 1
                if len(pending) == 1:
                    flush_at = time.perf_counter() + self.config.flush_after
                slow = duration > self.config.slow_job
            finished = True
            self._batch_took = time.perf_counter() - started
        except BaseException:
            # Leave nothing claimed without a heartbeat: unstarted jobs go back at once.
            done = {d.job.id for d in pending}
            pending += [Decision.release(j) for j in jobs[ran:] if j.id not in done]
            raise
        finally:
            self._slow = slow
            pending = self._synced(pending, syncs.close())
            if pending:
                ahead = claim_next and finished and not self._stopping.is_set()
                leased_at = elapsed()
                following = _Claimed(self._record(pending, claim=self._claim_limit() if ahead else 0), leased_at)
            with self._running_lock:
                for job in jobs:
                    self._running.pop(job.id, None)
                self.outcomes.update(edges)
            self.processed += ran
        return ran, following

    def _synced(self, pending: list[Decision], failed: dict[str, tuple[str, OSError]]) -> list[Decision]:
        """``pending`` once its jobs' directories are fsynced (``failed`` are the jobs whose
        directory fsync failed): a job whose entry is not durable is never recorded completed;
        its outcome becomes the failed fsync's, as if its handler had raised it."""
        if not failed:
            return pending
        out = []
        for d in pending:
            if d.edge == "complete" and d.job.id in failed:
                rel, e = failed[d.job.id]
                d = self._decide_safely(d.job, file_error(e, rel), d.duration or 0.0)
            out.append(d)
        return out

    def _run_handler(self, job: JobRecord, ctx: JobContext) -> tuple[Returned | Exception, float]:
        start = time.perf_counter()
        try:
            job_type = self.queue.registry.get(job.type)
            payload = job_type.recheck(self.queue.registry.parse(job.type, job.payload), self.queue.root)
            timeout = job.timeout if job.timeout is not None else job_type.timeout
            result = job_type.run(payload, ctx) if timeout is None else _run_bounded(job_type, payload, ctx, timeout)
            outcome: Returned | Exception = Returned(encode_result(job_type.name, result), ctx.followups())
        except Exception as e:  # a handler error never kills the worker
            outcome = e
        return outcome, time.perf_counter() - start

    def decide(self, job: JobRecord, outcome: Returned | BaseException, duration: float) -> Decision:
        """The one place a handler's outcome becomes a transition."""
        now = self.queue.clock.now()
        if isinstance(outcome, Returned):
            self._full_streak = 0
            return Decision(job, "complete", {"result": outcome.result}, outcome.children, duration, now)
        if isinstance(outcome, Cancelled):
            return Decision.release(job, duration)
        if isinstance(outcome, Deferred):
            return Decision.defer(job, error_text(outcome), outcome.until, duration)
        if isinstance(outcome, StorageFull):
            return Decision.snooze(job, error_text(outcome), now + self._storage_wait(), duration)
        error = error_text(outcome)
        if isinstance(outcome, (PermanentError, InvalidPayload)) or job.attempts >= job.max_attempts:
            return Decision.fail(job, error, duration, now)
        run_at = now + self.config.retry.delay(job.attempts)
        return Decision.retry(job, error, run_at, duration)

    def _trusted_until(self, batch: _Claimed) -> float | None:
        """Until when (``clock.elapsed()``) the batch's jobs are known to be this worker's without
        asking the ledger. No other worker takes these locks before they are lock_timeout old; for
        the first half of that the claim is proof enough (the margin heartbeat self-fencing keeps
        too), as long as every worker counts time on one machine's clocks. A worker on another
        machine may have been paused in a way its own counters do not see (a paused VM) while the
        others went on: there (None) the ledger is asked before every effect."""
        if not self.queue.backend.one_machine:
            return None
        return batch.leased_at + self.config.lock_timeout / 2

    def _storage_wait(self) -> timedelta:
        """How long a job that met a full data root waits: the retry policy's backoff over this
        worker's run of such jobs since one last completed, at most ``STORAGE_WAIT``, so that
        space which returns is used soon. Threads share the count; a lost increment only
        shortens one wait."""
        self._full_streak += 1
        return min(self.config.retry.delay(self._full_streak), STORAGE_WAIT)

    def _decide_safely(self, job: JobRecord, outcome: Returned | Exception, duration: float) -> Decision:
        try:
            return self.decide(job, outcome, duration)
        except Exception as e:  # e.g. a retry policy that raises: the job fails, visibly
            return Decision.fail(job, error_text(e), duration, self.queue.clock.now())

    def _record(self, decisions: list[Decision], *, claim: int = 0) -> list[JobRecord]:
        """Record outcomes in one group commit and, with ``claim``, take the next jobs in it;
        returns the jobs taken.

        The handlers' effects have happened: keep trying to record them while the database
        is unreachable (the heartbeat keeps the locks meanwhile). If we give up at a hard
        shutdown, the locks go stale and the jobs re-run; handlers are idempotent. A commit
        whose answer was lost is read back before anything is recorded again (ledger/recheck.py)."""
        backoff = 0.0
        refused_once = False
        unsure = False  # the last attempt's COMMIT may have landed
        while True:
            try:
                if unsure:
                    decisions, unsure = unsettled(self.queue, self.id, decisions), False
                    if not decisions:
                        return []
                return self._finish(decisions, claim)
            except LostCommit:
                # Read back at once (the pool opens a new connection); if the database is down,
                # the read fails and waits below. Jobs the lost commit may have claimed for the
                # next batch run nowhere until the sweep finds their locks stale.
                unsure, claim = True, 0
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as e:
                if self._fatal(e):
                    return []  # unrecorded: the locks go stale and the jobs run again elsewhere
                # Recording must not wait on claiming (which may be what fails), and a commit
                # that went through unseen must not leave a second batch claimed: retry without.
                claim = 0
                backoff = self._next_backoff(backoff)
                self._db_error(e, retry_in=backoff, jobs=len(decisions))
                if self._stopping.wait(backoff) and self._cancel.is_set():
                    return []
            except sa.exc.SQLAlchemyError as e:
                if self._fatal(e):
                    return []
                refused = self._refused(decisions, e, refused_once)
                if not refused:
                    return []
                decisions, refused_once = refused, True

    def _finish(self, decisions: list[Decision], claim: int) -> list[JobRecord]:
        """One attempt at a group commit (and the next claim in it)."""
        waits = self.queue.backend.lock_waits
        claimed = self.queue.finish_and_claim(
            self.id, decisions, records=False, claim=claim, claim_bytes=self.config.batch_bytes
        )[1]
        if claim:
            self._adapt(self.queue.backend.lock_waits != waits)
        return claimed

    def _refused(self, decisions: list[Decision], e: sa.exc.SQLAlchemyError, again: bool) -> list[Decision]:
        """The database refuses these outcomes (a value it cannot store): retrying would never
        end, so each is recorded alone, and one it refuses becomes a plain failure to record;
        returns what to record next (nothing once even the plain failure was refused, ``again``:
        the lock will go stale)."""
        events.emit("db_refused", worker=self.id, error=faults.describe(e), jobs=len(decisions))
        if len(decisions) > 1:
            for d in decisions:
                self._record([d])
            return []
        if again:
            return []
        [d] = decisions
        error = f"tether could not record this job's outcome ({d.edge}): {faults.describe(e)}"
        return [Decision.fail(d.job, error, d.duration)]

    def _db_error(self, error: BaseException, **fields: Any) -> None:
        """The event of a database error a loop retries after; a lost connection had its own
        (``connection_lost``) where it was met, and one drop costs one line."""
        if not isinstance(error, LostConnection):
            events.emit("db_error", worker=self.id, error=faults.describe(error), **fields)

    def heartbeat_once(self, now: datetime | None = None) -> list[str]:
        """Renew the locks of the jobs this worker is running; flag any it has lost."""
        with self._running_lock:
            running = list(self._running.values())
        lost = self.queue.heartbeat(self.id, [ctx.job for ctx in running], now=now)
        for ctx in running:
            job = ctx.job
            if job.id in lost:
                ctx.cancel(LEASE_LOST)
                events.emit("lost_lease", job_id=job.id, type=job.type, attempt=job.attempts, worker=self.id)
        return lost

    def sweep_once(self, now: datetime | None = None) -> list[JobRecord]:
        return self.queue.reclaim_stale(self.config.lock_timeout, now=now)

    # -- loops -------------------------------------------------------------------------------

    def run_until_idle(self, *, install_signals: bool = True) -> int:
        """Sweep stale locks, then run jobs until none is ready; returns how many ran. Signals
        stop it as they stop ``run()``."""
        with self._signals(install_signals):
            try:
                self.sweep_once()
            except sa.exc.SQLAlchemyError as e:
                if self._fatal(e):
                    raise self.fault from e  # type: ignore[misc]
                raise
            return self._run(until_idle=True)

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped (SIGINT/SIGTERM when ``install_signals``); returns jobs run. Raises
        LedgerFault, once its threads have stopped, if the ledger is corrupt, full, read-only or
        gone (``tether.ledger.faults``); other database errors are retried with backoff."""
        with self._signals(install_signals):
            return self._run(until_idle=False)

    def stop(self, *, cancel: bool = False) -> None:
        """Stop claiming; running jobs have ``shutdown_grace`` seconds to finish. With ``cancel``
        (or once the grace is over) they are cancelled: they stop at their next checkpoint and
        give their attempt back (an assistant's process group is terminated at once)."""
        self._stopping.set()
        grace = self.config.shutdown_grace
        if not cancel and self._grace_ends is None and grace is not None:
            self._grace_ends = time.monotonic() + grace
        if cancel:
            self._cancel.set()
            with self._running_lock:
                running = list(self._running.values())
            for ctx in running:
                ctx.cancel(SHUTDOWN)
        self.queue.wakeup.wake_local()
        with self._idle:
            self._idle.notify_all()

    def end_grace_once(self, now: float | None = None) -> bool:
        """Cancel the running jobs if the shutdown grace is over at ``now`` (monotonic seconds);
        returns whether it did. The supervising loop calls it on every turn."""
        ends = self._grace_ends
        if ends is None or self._cancel.is_set() or (time.monotonic() if now is None else now) < ends:
            return False
        with self._running_lock:
            running = len(self._running)
        events.emit("shutdown", worker=self.id, mode="cancel running jobs", reason="grace period over", running=running)
        self.stop(cancel=True)
        return True

    @contextmanager
    def _signals(self, install: bool) -> Iterator[None]:
        """SIGINT/SIGTERM stop this worker while it runs; the application's own handlers are
        put back afterwards."""
        if not install or threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self._stopping.is_set():  # the second: no more waiting
                events.emit("shutdown", worker=self.id, signal=name, mode="cancel running jobs", reason="second signal")
                self.stop(cancel=True)
                return
            grace = self.config.shutdown_grace
            events.emit("shutdown", worker=self.id, signal=name, mode="finish running jobs", grace_seconds=grace)
            self.stop()

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self, *, until_idle: bool) -> int:
        start_count = self.processed
        self._drained = False
        events.emit("worker_started", worker=self.id, threads=self.config.threads, until_idle=until_idle)
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
            self._supervise(threads, until_idle)
        finally:
            if any(t.is_alive() for t in threads):
                # Left by an exception (a KeyboardInterrupt an application catches): never
                # leave threads running jobs without heartbeats.
                self.stop(cancel=True)
                for t in threads:
                    while t.is_alive():
                        t.join(timeout=min(1.0, self.config.heartbeat_every))
                        self._beat_quietly()
            if watcher is not None:
                watcher.stop()
        fault = self.fault
        events.emit(
            "worker_stopped",
            worker=self.id,
            processed=self.processed - start_count,
            fault=None if fault is None else fault.kind,
        )
        if fault is not None:
            raise fault
        return self.processed - start_count

    def _supervise(self, threads: list[threading.Thread], until_idle: bool) -> None:
        """Heartbeats and sweeps while the claiming threads run."""
        next_beat = time.monotonic() + self.config.heartbeat_every
        next_sweep = time.monotonic() + self.config.sweep_every
        while any(t.is_alive() for t in threads):
            threads[0].join(timeout=min(0.2, self.config.heartbeat_every))
            self.end_grace_once()
            if self.fault is None:
                self._fatal(self.queue.backend.file_fault())
            now = time.monotonic()
            if now >= next_beat:
                self._beat_quietly()
                next_beat = now + self.config.heartbeat_every
            if now >= next_sweep and not until_idle:
                try:
                    self.sweep_once()
                except sa.exc.SQLAlchemyError as e:
                    if not self._fatal(e):
                        self._db_error(e)
                next_sweep = now + self.config.sweep_every

    def _beat_quietly(self) -> None:
        """A heartbeat; when none has succeeded for half the lock timeout, this worker can no
        longer be sure its locks hold, so its running jobs stop at their next checkpoint."""
        try:
            self.heartbeat_once()
            self._last_beat = time.monotonic()
        except sa.exc.SQLAlchemyError as e:
            if self._fatal(e):
                return
            self._db_error(e)
            if time.monotonic() - self._last_beat > self.config.lock_timeout / 2:
                with self._running_lock:
                    contexts = list(self._running.values())
                for ctx in contexts:
                    ctx.cancel(LEASE_LOST)

    def _loop(self, until_idle: bool) -> None:
        # Jobs claimed in the commit that recorded the last batch: taken back if the loop ends
        # before they run, so none waits for the stale sweep.
        carried = _Claimed()
        try:
            self._loop_claiming(until_idle, carried)
        finally:
            if carried.jobs:
                self._record([Decision.release(job) for job in carried.jobs])

    def _loop_claiming(self, until_idle: bool, carried: _Claimed) -> None:
        backoff = 0.0
        while not self._stopping.is_set():
            seen = self.queue.wakeup.generation()
            with self._idle:
                if self._drained and not carried.jobs:
                    return
                self._busy += 1
            try:
                self._fire_schedules()
                batch = _Claimed(carried.jobs, carried.leased_at) if carried.jobs else self._claim()
                carried.jobs = []
                ran, following = self._run_batch(batch, claim_next=True)
                carried.jobs, carried.leased_at = following.jobs, following.leased_at
                backoff = 0.0
            except sa.exc.SQLAlchemyError as e:
                if self._fatal(e):
                    return
                backoff = self._next_backoff(backoff)
                self._db_error(e, retry_in=backoff)
                ran = -1
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
            if ran > 0:
                continue
            if ran < 0:
                self._stopping.wait(backoff)
                continue
            self.empty_polls += 1
            if until_idle:
                with self._idle:
                    # Idle only when no other thread is running a job that could unblock one.
                    if self._busy == 0:
                        self._drained = True
                        self._idle.notify_all()
                        return
                    self._idle.wait_for(lambda: self._busy == 0 or self._drained or self._stopping.is_set())
            else:
                self.queue.wakeup.wait(seen, self.config.poll_interval)

    def _fatal(self, error: BaseException | None) -> bool:
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
        events.emit("ledger_fault", worker=self.id, fault=fault.kind, error=str(fault))
        self.stop(cancel=True)
        return True

    def _next_backoff(self, current: float) -> float:
        return min(self.config.max_db_backoff, max(self.config.poll_interval, current * 2))


def _run_bounded(job_type: JobType[Any], payload: Payload, ctx: JobContext, timeout: float) -> Any:
    """``job_type.run`` in a thread of its own, waited for at most ``timeout`` seconds. Past it
    the job is cancelled (``ctx.cancelled`` is set) and the attempt ends as a retryable
    JobTimedOut at once: the worker moves on. A handler that ignores the cancellation keeps
    its daemon thread until it returns; what it returns then is dropped, its follow-up jobs are
    never committed, and a write through ``files.locked_write`` (which confirms the lease and so
    checks cancellation) is refused."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, job_type.run(payload, ctx)))
        except BaseException as e:  # handed to the worker thread, which decides
            box.append((False, e))
        finally:
            done.set()

    done = threading.Event()
    threading.Thread(target=run, name=f"tether-job-{ctx.job.id}", daemon=True).start()
    if not done.wait(timeout):
        ctx.cancel(TIMEOUT)
        raise JobTimedOut(ctx.job.type, ctx.job.id, timeout)
    returned, value = box[0]
    if returned:
        return value
    raise value
