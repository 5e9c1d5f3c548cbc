"""The worker's executor: runs a job's handler (in a thread of its own when the job has a
timeout) and keeps the running jobs' contexts, through which they are cancelled.

An async handler (``async def run``) runs to its end on an event loop of the thread that would
run a sync one, one job at a time: the worker's threads stay its concurrency, so order per
target, batches and their group commits, fences and timeouts are the same for both kinds. A
shared loop running many jobs at once would need a second executor and completer; what an
async handler gains here is that its awaits can be cancelled (``perform``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterable, Sequence
from types import CoroutineType
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import tracing
from ..errors import JobTimedOut
from ..jobtypes.context import TIMEOUT, JobContext
from ..ledger.lifecycle import encode_result
from ..ledger.record import JobRecord, make_tuple

if TYPE_CHECKING:
    from ..jobtypes import JobType, Payload
    from ..jobtypes.datafiles.dirsync import DirSyncs
    from ..ledger.queue import Queue


class Returned(NamedTuple):
    """The handler returned normally: its result (stored JSON) and its follow-up jobs."""

    result: Any
    children: Sequence[JobRecord]


class Executor:
    """Runs handlers for one worker; ``cancel`` is set once running jobs are to stop (shutdown)."""

    def __init__(self, queue: Queue, worker_id: str, cancel: threading.Event) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.cancel = cancel
        self._running: dict[str, JobContext] = {}  # by job id; ctx.job is the job
        # Running jobs whose outcome is being recorded: their fence is the completer's to judge,
        # since a heartbeat that misses one of them may only have run after its commit.
        self._settling: set[str] = set()
        self._lock = threading.Lock()

    def start(
        self, jobs: Sequence[JobRecord], trusted_until: float | None = None, dir_syncs: DirSyncs | None = None
    ) -> list[JobContext]:
        """A context for each of ``jobs``, counted as running (heartbeats renew their locks)
        until ``done``."""
        contexts = [
            JobContext(job, self.queue, self.cancel, self.worker_id, trusted_until=trusted_until, dir_syncs=dir_syncs)
            for job in jobs
        ]
        with self._lock:
            for job, ctx in zip(jobs, contexts, strict=True):
                self._running[job.id] = ctx
        return contexts

    def settling(self, ids: Iterable[str]) -> None:
        """The outcomes of the jobs ``ids`` are about to be recorded (heartbeats still renew them
        until ``done``)."""
        with self._lock:
            self._settling.update(ids)

    def done(self, jobs: Sequence[JobRecord]) -> None:
        with self._lock:
            for job in jobs:
                self._running.pop(job.id, None)
                self._settling.discard(job.id)

    def lost(self, ids: Iterable[str]) -> list[JobContext]:
        """Of ``ids`` (jobs a heartbeat found this worker no longer holds), the contexts of those
        still running with no outcome being recorded: the jobs another worker has taken."""
        with self._lock:
            return [self._running[i] for i in ids if i in self._running and i not in self._settling]

    def busy(self) -> bool:
        """Whether any job is running (no copy of the running set is made)."""
        return bool(self._running)

    def running(self) -> list[JobContext]:
        """The contexts of the jobs running now (claimed, not yet recorded)."""
        with self._lock:
            return list(self._running.values())

    def cancel_running(self, reason: str) -> None:
        """Ask every running job to stop at its next checkpoint, for ``reason``."""
        for ctx in self.running():
            ctx.cancel(reason)

    def run(self, job: JobRecord, ctx: JobContext) -> tuple[Returned | Exception, float]:
        """Run ``job``'s handler; returns what it came to (never raises for a handler's error)
        and how long it took (seconds)."""
        start = time.perf_counter()
        try:
            registry = self.queue.registry
            job_type = registry.get(job.type)
            payload = job_type.recheck(registry.parse(job.type, job.payload), self.queue.root)
            timeout = job.timeout if job.timeout is not None else job_type.timeout
            result = (
                perform(job_type, payload, ctx) if timeout is None else _run_bounded(job_type, payload, ctx, timeout)
            )
            # Returned(...) without the NamedTuple's Python __new__ (one per job)
            outcome: Returned | Exception = make_tuple(
                Returned, (encode_result(job_type.name, result), ctx.followups())
            )
        except Exception as e:  # a handler error never kills the worker
            outcome = e
        return outcome, time.perf_counter() - start


CANCEL_POLL = 0.05
"""Seconds between two looks at an async handler's context for a cancellation (a timeout, a
shutdown, a lost lease, an operator's cancel): how late its await is cancelled at most."""


def perform(job_type: JobType[Any], payload: Payload, ctx: JobContext) -> Any:
    """Call the handler; a coroutine it returns (``async def run``) is run to its end on a new
    event loop of this thread, so nothing bound to the loop outlives the attempt."""
    result = job_type.run(payload, ctx)
    if isinstance(result, CoroutineType):  # inspect.iscoroutine's test, without its frame
        return asyncio.run(_cancellable(result, ctx))
    return result


async def _cancellable(handler: Coroutine[Any, Any, Any], ctx: JobContext) -> Any:
    """Await ``handler``; once ``ctx`` is cancelled, cancel it at its current await (its
    ``finally`` blocks run) and raise Cancelled naming why. A handler that catches the
    cancellation and returns has done its work: what it returns stands."""
    task = asyncio.ensure_future(handler)
    while not (await asyncio.wait((task,), timeout=CANCEL_POLL))[0]:
        if ctx.cancel_reason is not None:
            task.cancel()
            try:
                return await task
            except asyncio.CancelledError:
                ctx.checkpoint()
                raise
    return task.result()


def _run_bounded(job_type: JobType[Any], payload: Payload, ctx: JobContext, timeout: float) -> Any:
    """``job_type.run`` in a thread of its own, waited for at most ``timeout`` seconds. Past it
    the job is cancelled (``ctx.cancelled`` is set) and the attempt ends as a retryable
    JobTimedOut at once: the worker moves on. A handler that ignores the cancellation keeps
    its daemon thread until it returns; what it returns then is dropped, its follow-up jobs are
    never committed, and a write through ``files.write_locked`` (which confirms the lease and so
    checks cancellation) is refused."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, perform(job_type, payload, ctx)))
        except BaseException as e:  # handed to the worker thread, which decides
            box.append((False, e))
        finally:
            done.set()

    done = threading.Event()
    # In this thread's context: the attempt's span stays the parent of what the handler traces.
    threading.Thread(target=tracing.in_context(run), name=f"tether-job-{ctx.job.id}", daemon=True).start()
    if not done.wait(timeout):
        ctx.cancel(TIMEOUT)
        raise JobTimedOut(ctx.job.type, ctx.job.id, timeout)
    returned, value = box[0]
    if returned:
        return value
    raise value
