"""A job type for the cancel tests, in-process and in real worker processes (loaded with
``tether --import tests.proc_cancel worker ...``, the repository on PYTHONPATH).

``slow_write``: a ``create_file`` (same payload fields, same probe) whose handler waits for its
cancellation before (``write_first`` false) or after (true) writing its file, appending
``<job id> <pid>`` to ``started`` once it is waiting; with ``children`` it first enqueues one
``create_file`` follow-up job per name. It gives up waiting after ``hold`` seconds.

``tick``: sleeps ``sleep`` seconds (the pause tests' second type).
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

from tether import JobContext, JobType, Payload
from tether.jobtypes import CreateFile
from tether.jobtypes.create_file import CreateFileType


class SlowWrite(CreateFile):
    job_type: ClassVar[str] = "slow_write"
    write_first: bool = False
    children: list[str] = []
    started: str | None = None  # a file the handler appends "<job id> <pid>" to once it waits
    hold: float = 60.0
    finish_anyway: bool = False  # return normally once cancelled (a handler that ignores it)


class SlowWriteType(CreateFileType):
    name = "slow_write"
    payload_model = SlowWrite

    def run(self, payload: CreateFile, ctx: JobContext) -> dict[str, Any]:
        assert isinstance(payload, SlowWrite)
        for child in payload.children:
            ctx.enqueue(CreateFile(path=f"children/{child}.json", content={"child": child}))
        written = super().run(payload, ctx) if payload.write_first else None
        if payload.started:
            with open(payload.started, "a") as f:
                f.write(f"{ctx.job.id} {os.getpid()}\n")
        ctx.cancelled.wait(payload.hold)
        if not payload.finish_anyway:
            ctx.checkpoint()
        return written or super().run(payload, ctx)


class Tick(Payload):
    job_type: ClassVar[str] = "tick"
    n: int
    sleep: float = 0.01


class TickType(JobType[Tick]):
    """Sleeps ``sleep`` seconds: a job with no effect, for the pause tests."""

    name = "tick"
    payload_model = Tick

    def run(self, payload: Tick, ctx: JobContext) -> None:
        time.sleep(payload.sleep)


def register(registry: Any) -> None:
    registry.register(SlowWriteType())
    registry.register(TickType())
