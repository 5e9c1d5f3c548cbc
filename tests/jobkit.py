"""Small job types for in-process tests: a recorder, a scripted failer, a blocker, a spawner."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import datetime
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


__all__ = ["Block", "BlockType", "Note", "NoteType", "Spawn", "SpawnType", "completed", "registry_with"]


def completed(job: JobRecord, result: Any = None, *, finished_at: datetime | None = None) -> Decision:
    """The decision a worker records for ``job`` when its handler returned ``result`` (the
    completer's ``decide`` given ``Returned``), for tests that drive the queue by hand."""
    return Decision(job, "complete", {"result": encode_result(job.type, result)}, finished_at=finished_at)
