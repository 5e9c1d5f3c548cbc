"""The asyncio API (tether.aio) and async handlers: calls never hold the event loop, they return
once the job is committed, and an ``async def run`` handler runs, fails and is cancelled as a
sync one is. The FastAPI example runs here too."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest
from pydantic import BaseModel

from tether import AsyncCoordinator, AsyncJsonStore, Coordinator, JobContext, JobStatus, JobType, Payload
from tether.errors import JobNotFound
from tether.jobtypes import CreateFile, default_registry
from tether.store import ModelNotFound

REPO = Path(__file__).resolve().parents[1]


class Person(BaseModel):
    handle: str
    email: str


@pytest.fixture
def ledger(tmp_path: Path) -> dict[str, Any]:
    return {"db_url": f"sqlite:///{tmp_path / 'tether.db'}", "root": tmp_path / "data"}


def test_an_async_enqueue_waits_on_a_thread_while_the_loop_runs_and_returns_the_committed_job(ledger):
    async def main() -> str:
        async with await AsyncCoordinator.open(**ledger) as c:
            gate = threading.Event()
            real = c.sync.queue.enqueuer.enqueue

            def gated(*args: Any, **kwargs: Any) -> Any:
                # Run on the loop's thread, this would wait for the loop it holds.
                assert gate.wait(5), "the event loop did not run while the enqueue was in flight"
                return real(*args, **kwargs)

            c.sync.queue.enqueuer.enqueue = gated
            task = asyncio.create_task(c.enqueue(CreateFile(path="a.json", content={"n": 1})))
            await asyncio.sleep(0.01)
            gate.set()
            return (await task).id

    job_id = asyncio.run(main())
    with Coordinator.open(**ledger) as other:  # another connection sees it: it was committed
        assert other.get(job_id).status is JobStatus.PENDING


def test_an_async_coordinator_starts_its_threads_at_open_so_a_burst_of_calls_does_not_start_them_on_the_loop(ledger):
    def pool_threads() -> int:
        return sum(t.name.startswith("tether-async") for t in threading.enumerate())

    async def main() -> int:
        async with await AsyncCoordinator.open(**ledger, threads=5) as c:
            started = pool_threads()
            await c.enqueue(CreateFile(path="a.json", content={"n": 1}))
            return started

    assert pool_threads() == 0
    assert asyncio.run(main()) == 5


def test_an_error_raised_on_the_coordinators_thread_reaches_the_task_that_awaited_the_call(ledger):
    async def main() -> None:
        async with await AsyncCoordinator.open(**ledger) as c:
            with pytest.raises(JobNotFound, match="no job"):
                await asyncio.wait_for(c.get("01J00000000000000000000000"), 5)

    asyncio.run(main())


def test_a_cancelled_await_leaves_its_enqueue_to_commit_and_the_loop_without_an_error(ledger):
    errors: list[dict[str, Any]] = []
    committed: list[Any] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        # One thread: a later call runs after the cancelled one has handed its outcome to the loop.
        async with await AsyncCoordinator.open(**ledger, threads=1) as c:
            gate = threading.Event()
            real = c.sync.queue.enqueuer.enqueue

            def gated(*args: Any, **kwargs: Any) -> Any:
                assert gate.wait(5)
                committed.extend(real(*args, **kwargs))
                return committed

            c.sync.queue.enqueuer.enqueue = gated
            task = asyncio.create_task(c.enqueue(CreateFile(path="a.json", content={"n": 1})))
            await asyncio.sleep(0)  # the task takes its first step: the call is handed to the thread
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            gate.set()
            await c.call(lambda: None)  # its outcome came after the cancelled call's, in order

    asyncio.run(main())
    assert errors == []
    with Coordinator.open(**ledger) as other:
        assert other.get(committed[0].job.id).status is JobStatus.PENDING


def test_the_async_store_saves_flushes_loads_and_deletes_a_model(ledger):
    async def main() -> None:
        async with await AsyncCoordinator.open(**ledger) as c:
            store = AsyncJsonStore(c)
            saved = await store.save("people/ada.json", Person(handle="ada", email="ada@example.org"))
            [done] = await store.flush()
            assert done.id == saved.id and done.status is JobStatus.COMPLETED
            assert await store.load("people/ada.json", Person) == Person(handle="ada", email="ada@example.org")
            assert await store.exists("people/ada.json")
            await store.delete("people/ada.json", wait=True)
            with pytest.raises(ModelNotFound):
                await store.load("people/ada.json", Person)

    asyncio.run(main())


def test_the_async_store_records_extraction_and_aws_jobs(ledger):
    async def main() -> list[str]:
        async with await AsyncCoordinator.open(**ledger) as c:
            store = AsyncJsonStore(c)
            await store.save("req/r1.json", {"id": "r1", "text": "a field"}, wait=True)
            extraction = await store.extract("req/r1.json", "answers/r1.json", template="{text}")
            queue = await store.sync_aws("sqs_queue", "jobs", {"state": "present"}, region="eu-west-1")
            return [(await c.get(r.id)).type for r in (extraction, queue)]

    assert asyncio.run(main()) == ["claude_extraction", "sync_aws"]


class Fetch(Payload):
    job_type: ClassVar[str] = "fetch"
    name: str
    fail: bool = False
    hang: bool = False


class FetchType(JobType[Fetch]):
    """An async handler: awaits, then returns, fails, or hangs until cancelled."""

    name = "fetch"
    payload_model = Fetch

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cleaned_up = threading.Event()

    async def run(self, payload: Fetch, ctx: JobContext) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        if payload.fail:
            raise RuntimeError(f"{payload.name} is unreachable")
        if payload.hang:
            self.started.set()
            try:
                await asyncio.sleep(60)
            finally:
                self.cleaned_up.set()
        return {"fetched": payload.name, "loop": asyncio.get_running_loop().is_running()}


@pytest.fixture
def fetching(ledger) -> Any:
    registry = default_registry()
    fetch = FetchType()
    registry.register(fetch)
    with Coordinator.open(registry=registry, **ledger) as c:
        yield c, fetch


def test_an_async_handler_runs_on_an_event_loop_and_its_result_is_recorded(fetching):
    c, _ = fetching
    ok = c.enqueue(Fetch(name="a"))
    failing = c.enqueue(Fetch(name="b", fail=True), max_attempts=1)
    assert c.run_until_idle() == 2
    assert c.get(ok.id).status is JobStatus.COMPLETED
    assert orjson.loads(c.get(ok.id).result or "null") == {"fetched": "a", "loop": True}
    assert c.get(failing.id).status is JobStatus.FAILED
    assert "b is unreachable" in (c.get(failing.id).last_error or "")


def test_an_async_handler_past_its_timeout_is_cancelled_at_its_await_and_its_finally_runs(fetching):
    c, fetch = fetching
    job = c.enqueue(Fetch(name="slow", hang=True), timeout=0.2, max_attempts=2)
    started = time.monotonic()
    c.worker().run_once()
    assert time.monotonic() - started < 5
    record = c.get(job.id)
    assert record.status is JobStatus.PENDING and "timeout" in (record.last_error or "")
    assert fetch.cleaned_up.wait(5), "the hanging await was never cancelled"


def test_an_async_handler_stopped_at_shutdown_is_cancelled_at_its_await_and_gives_its_attempt_back(fetching):
    c, fetch = fetching
    job = c.enqueue(Fetch(name="slow", hang=True))
    worker = c.worker()
    running = threading.Thread(target=worker.run_once)
    running.start()
    assert fetch.started.wait(10)
    worker.stop(cancel=True)
    running.join(10)
    assert not running.is_alive(), "the worker still waits on the handler's await"
    record = c.get(job.id)
    assert (record.status, record.attempts) == (JobStatus.PENDING, 0)
    assert fetch.cleaned_up.is_set()


def test_the_fastapi_example_records_a_save_and_serves_it_once_a_worker_ran_it(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    monkeypatch.setenv("TETHER_DB", f"sqlite:///{tmp_path / 'app.db'}")
    monkeypatch.setenv("TETHER_ROOT", str(tmp_path / "data"))
    spec = importlib.util.spec_from_file_location("fastapi_app", REPO / "examples" / "fastapi_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fastapi_app"] = module  # FastAPI resolves the handlers' annotations through it
    try:
        spec.loader.exec_module(module)
        with TestClient(module.app) as client:
            assert client.get("/people/ada").status_code == 404
            saved = client.put("/people/ada", json={"handle": "ada", "email": "ada@example.org"})
            assert saved.status_code == 202, saved.text
            assert client.put("/people/bob", json={"handle": "ada", "email": "x"}).status_code == 422
            with Coordinator.open() as worker_side:  # a worker beside the application
                assert worker_side.get(saved.json()["job"]).status is JobStatus.PENDING
                assert worker_side.run_until_idle() == 1
            assert client.get("/people/ada").json() == {"handle": "ada", "email": "ada@example.org"}
    finally:
        del sys.modules["fastapi_app"]
