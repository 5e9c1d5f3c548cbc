"""The asyncio API: ``AsyncCoordinator`` and ``AsyncJsonStore`` for async applications.

Each call runs its synchronous twin (``Coordinator``, ``JsonStore``) on a thread of a pool the
async coordinator owns and awaits it, so the event loop never waits on a commit, an fsync or a
file read, and the durability promise is the sync one: ``await c.enqueue(...)`` returns once
the job is durably committed. There is one insert path: single enqueues that arrive together
from the pool's threads share what the sync enqueue shares between threads.

A separate object rather than ``enqueue_async`` beside ``enqueue``: every method of it is a
coroutine, so an async handler holding one cannot call a blocking method by mistake, and a
type checker flags a missing ``await``. ``.sync`` is the coordinator underneath, for what has
no async twin (``worker()``, ``register``, observe's reads at start-up).

Cancelling an ``await`` (a client that disconnects mid-request) does not stop its thread: an
enqueue already sent commits all the same. Pass ``key=`` where a retry must not record a job
twice, as after ``CommitUnknown``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from .coordinator import Coordinator
from .store import JsonStore

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .jobtypes import JobType, Payload
    from .ledger.record import InsertResult, JobRecord

T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")

DEFAULT_THREADS = 8
"""Threads an async coordinator runs its calls on: enough that enqueues from many tasks arrive
together and share commits, few enough that a burst of requests does not open a connection each."""


class AsyncCoordinator:
    """``c = await AsyncCoordinator.open(url, root=...)``; ``await c.enqueue(payload)``;
    ``await c.close()`` (or ``async with``)."""

    def __init__(self, coordinator: Coordinator, *, threads: int = DEFAULT_THREADS) -> None:
        self.sync = coordinator
        """The synchronous coordinator every call runs on."""
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tether-async")
        _start_threads(self._pool, threads)

    @classmethod
    async def open(
        cls, db_url: str | None = None, *, threads: int = DEFAULT_THREADS, **options: Any
    ) -> AsyncCoordinator:
        """Open (or create) the ledger as ``Coordinator.open(db_url, **options)`` does, on a
        thread: creating a ledger or checking its schema is database work."""
        coordinator = await asyncio.to_thread(functools.partial(Coordinator.open, db_url, **options))
        return cls(coordinator, threads=threads)

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on this coordinator's threads, awaited (for a sync call that has
        no async twin here)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        # The caller's context goes with the call, as asyncio.to_thread's does: a trace (the
        # span current in the task) is what an enqueue records with its job. The thread settles
        # the future itself rather than through run_in_executor's chained futures, which cost
        # the loop twice the work a call: what the loop spends per call is what a burst of
        # requests stalls it by.
        self._pool.submit(_settle, loop, future, contextvars.copy_context(), fn, args, kwargs)
        return await future

    def register(self, job_type: JobType[Any]) -> JobType[Any]:
        """Add an application's own job type (no database work: not a coroutine)."""
        return self.sync.register(job_type)

    async def enqueue(self, payload: Payload, **options: Any) -> InsertResult:
        """Record a job; returns once it is durably committed (options as ``Coordinator.enqueue``,
        less ``session``: an application's transaction is a sync session's)."""
        return await self.call(self.sync.enqueue, payload, **options)

    async def enqueue_many(self, payloads: Sequence[Payload], **options: Any) -> list[InsertResult]:
        """Several jobs in one transaction: all are recorded or none."""
        return await self.call(self.sync.enqueue_many, payloads, **options)

    async def get(self, job_id: str) -> JobRecord:
        return await self.call(self.sync.get, job_id)

    async def retry(self, job_id: str, payload: Payload | None = None) -> JobRecord:
        return await self.call(self.sync.retry, job_id, payload)

    async def cancel(self, *job_ids: str, **options: Any) -> list[Any]:
        return await self.call(self.sync.cancel, *job_ids, **options)

    async def run_until_idle(self, **config: Any) -> int:
        """Run every ready job in this process (on a worker's own threads), then return how many ran."""
        return await self.call(self.sync.run_until_idle, **config)

    async def close(self) -> None:
        """Wait for the calls in flight, then close the coordinator."""
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self._pool.shutdown(wait=True)
        self.sync.close()  # disposing of the engine closes connections: database work too

    async def __aenter__(self) -> AsyncCoordinator:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[T],
    context: contextvars.Context,
    fn: Callable[..., T],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Run ``fn`` in ``context`` on a pool thread and give ``future`` its outcome on the loop."""
    try:
        outcome: tuple[Callable[..., None], Any] = (_set_result, context.run(fn, *args, **kwargs))
    except BaseException as e:  # the awaiting task gets it, as run_in_executor would give it
        outcome = (_set_exception, e)
    if not loop.is_closed():  # a loop closed meanwhile has no task left to receive it
        loop.call_soon_threadsafe(outcome[0], future, outcome[1])


def _set_result(future: asyncio.Future[T], result: T) -> None:
    if not future.done():  # a task cancelled meanwhile has nothing to receive
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _start_threads(pool: ThreadPoolExecutor, threads: int) -> None:
    """Start every thread of ``pool`` now: a pool starts a thread on a submit that finds none
    idle, and a burst of requests would otherwise start them all on the event loop's thread,
    stalling it while they start."""
    started = threading.Barrier(threads)
    for _ in range(threads):
        # Each waits until all have started, so none is idle for the next submit to reuse; a
        # thread that could not start breaks the barrier after a while rather than hold the rest.
        pool.submit(started.wait, 10)


class AsyncJsonStore:
    """``store = AsyncJsonStore(coordinator)``; ``await store.save("people/ada.json", person)``.

    The methods of ``JsonStore`` (options alike, less ``session``), each awaited on the async
    coordinator's threads: ``save``/``delete``/``extract``/``sync_aws`` return once the job is
    durably committed (``wait=True`` also runs it); ``flush`` runs this store's jobs in this
    process; ``load`` reads a model from disk without the loop waiting on the read."""

    def __init__(self, coordinator: AsyncCoordinator, **options: Any) -> None:
        self.coordinator = coordinator
        self.sync = JsonStore(coordinator.sync, **options)
        """The synchronous store underneath (``payload``, ``canonical``, ``path``)."""

    async def save(self, path: str, model: BaseModel | Mapping[str, Any], **options: Any) -> InsertResult:
        return await self.coordinator.call(self.sync.save, path, model, **options)

    async def delete(self, path: str, **options: Any) -> InsertResult:
        return await self.coordinator.call(self.sync.delete, path, **options)

    async def extract(self, requirement_path: str, target_path: str, **options: Any) -> InsertResult:
        return await self.coordinator.call(self.sync.extract, requirement_path, target_path, **options)

    async def sync_aws(
        self, resource_type: str, resource_id: str, config: Mapping[str, Any] | None = None, **options: Any
    ) -> InsertResult:
        return await self.coordinator.call(self.sync.sync_aws, resource_type, resource_id, config, **options)

    async def flush(self, timeout: float | None = None) -> list[JobRecord]:
        """Run queued jobs until every job this store recorded has completed (NotApplied if one
        failed or is still waiting after ``timeout``)."""
        return await self.coordinator.call(self.sync.flush, timeout)

    async def wait(self, job_ids: list[str], timeout: float | None = None) -> list[JobRecord]:
        return await self.coordinator.call(self.sync.wait, job_ids, timeout)

    async def load(self, path: str, model: type[M]) -> M:
        return await self.coordinator.call(self.sync.load, path, model)

    async def load_json(self, path: str) -> Any:
        return await self.coordinator.call(self.sync.load_json, path)

    async def exists(self, path: str) -> bool:
        return await self.coordinator.call(self.sync.exists, path)
