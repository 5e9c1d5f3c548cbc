"""An --import module for worker subprocesses that share a periodic job (test_schedule_processes):
``register(registry)`` adds its job type, ``schedules(coordinator)`` declares the schedule."""

from __future__ import annotations

from typing import Any, ClassVar

from tether import JobContext, JobType, Payload


class Tick(Payload):
    job_type: ClassVar[str] = "tick"


class TickType(JobType[Tick]):
    name = "tick"
    payload_model = Tick

    def run(self, payload: Tick, ctx: JobContext) -> Any:
        return None


def register(registry: Any) -> None:
    registry.register(TickType())


def schedules(coordinator: Any) -> None:
    coordinator.schedule("every-second", "* * * * * *", Tick())
