"""Small job types for in-process tests: a recorder, a scripted failer, a blocker, a spawner."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any, ClassVar

from tether import JobContext, JobType, Payload, PermanentError
from tether.jobtypes import CreateFile, default_registry
from tether.ledger.lifecycle import Decision, encode_result
from tether.ledger.record import JobRecord


class Note(Payload):
    job_type: ClassVar[str] = "note"
    name: str
    target: str | None = None
    fail_times: int = 0
    permanent: bool = False


class NoteType(JobType[Note]):
    """Records each run; fails ``fail_times`` times first (permanently if ``permanent``)."""

    name = "note"
    payload_model = Note

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []
        self.seen: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()

    def ordering_key(self, payload: Note) -> str | None:
        return payload.target

    def run(self, payload: Note, ctx: JobContext) -> dict[str, Any]:
        with self.lock:
            self.seen[payload.name] += 1
            n = self.seen[payload.name]
            self.runs.append((payload.name, ctx.job.attempts))
        if n <= payload.fail_times:
            if payload.permanent:
                raise PermanentError(f"{payload.name} can never work")
            raise RuntimeError(f"{payload.name} failed on run {n}")
        return {"name": payload.name}


class Block(Payload):
    job_type: ClassVar[str] = "block"
    name: str
    checkpoints: bool = True


class BlockType(JobType[Block]):
    """Signals ``started`` then waits for ``release``; with checkpoints, honours cancellation."""

    name = "block"
    payload_model = Block

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self, payload: Block, ctx: JobContext) -> None:
        self.started.set()
        while not self.release.wait(0.005):
            if payload.checkpoints:
                ctx.checkpoint()
        return None


class Spawn(Payload):
    job_type: ClassVar[str] = "spawn"
    children: list[str]
    fail: bool = False


class SpawnType(JobType[Spawn]):
    """Enqueues one create_file child per name, then fails if asked to."""

    name = "spawn"
    payload_model = Spawn

    def run(self, payload: Spawn, ctx: JobContext) -> None:
        for child in payload.children:
            ctx.enqueue(CreateFile(path=f"children/{child}.json", content={"child": child}))
        if payload.fail:
            raise PermanentError("parent failed after enqueueing children")


def registry_with(*extra: JobType):
    registry = default_registry()
    for job_type in extra:
        registry.register(job_type)
    return registry


__all__ = ["Block", "BlockType", "Note", "NoteType", "Spawn", "SpawnType", "busy_window", "completed", "registry_with"]


def busy_window(c: Any, n: int, *, took: Any = lambda i: 1.0, status: str = "completed", result: Any = None) -> None:
    """``n`` jobs of type ``work`` that finished half an hour ago, job i at microsecond i of its
    second (the sample of durations and metrics takes those at a multiple of k), each ``took(i)``
    seconds from claim to completion; ``result(i)``, when given, is its stored result."""
    import sqlalchemy as sa

    from tether.ledger import schema

    second = c.clock.now().replace(microsecond=0)
    rows = []
    for i in range(n):
        done = second - timedelta(minutes=30, microseconds=-i)
        rows.append(
            {
                "id": f"{status[0]}{i:025d}",
                "type": "work",
                "payload": "{}",
                "status": status,
                "attempts": 1,
                "created_at": done - timedelta(seconds=10),
                "run_at": done - timedelta(seconds=10),
                "claimed_at": done - timedelta(seconds=took(i)),
                "completed_at": done,
                "result": None if result is None else result(i),
            }
        )
    with c.engine.begin() as conn:
        conn.execute(sa.insert(schema.jobs), rows)


def completed(job: JobRecord, result: Any = None, *, finished_at: datetime | None = None) -> Decision:
    """The decision a worker records for ``job`` when its handler returned ``result`` (the
    completer's ``decide`` given ``Returned``), for tests that drive the queue by hand."""
    return Decision.complete(job, encode_result(job.type, result), (), None, finished_at)


def seed_states(c: Any, clock: Any) -> dict[str, int]:
    """A ledger with jobs in every state the overview counts (a ``FakeClock`` fixes the page's
    now): 2 completed files and one edited by hand since, 2 failed, and outstanding jobs that are
    ready, scheduled, retrying, running and stuck; a recorded reconcile check sees the one file
    drifted; two workers registered, one gone (it held the stuck job), one running. Returns the
    counts the overview should show."""
    from tether.jobtypes import DeleteFile
    from tether.ledger import workers
    from tether.reconcile.check import reconcile

    for i in range(2):
        c.enqueue(CreateFile(path=f"notes/n{i + 9}.json", content={"n": i}))
    c.enqueue(Note(name="boom", fail_times=9, permanent=True))
    c.enqueue(Note(name="bust", fail_times=9, permanent=True))
    c.run_until_idle()
    (c.root / "notes" / "n9.json").write_text('{"n": "edited by hand"}\n')
    c.enqueue(Note(name="held-by-the-dead"))
    workers.register(c.queue, "gone-host:1:dead", 2)
    c.queue.claim("gone-host:1:dead")
    clock.advance(c.lock_timeout + 10)  # that lock is now stale: stuck, and its worker gone
    workers.register(c.queue, "live-host:2:alive", 4)
    c.enqueue(Note(name="flaky", fail_times=1))
    c.worker().run_once()  # fails once: waits out its backoff
    for i in range(3):
        c.enqueue(Note(name=f"ready-{i}"))
    [running] = c.queue.claim("live-host:2:alive")  # the oldest of the three: running
    c.queue.record_progress(running, "live-host:2:alive", '{"done": 40, "total": 100, "note": "copying"}')
    for i in range(2):
        c.enqueue(DeleteFile(path=f"later/{i}.json"), delay=3600)
    reconcile(c)
    return {"ready": 2, "scheduled": 2, "retrying": 1, "running": 1, "stuck": 1, "failed": 2, "drift": 1}
