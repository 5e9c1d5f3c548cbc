"""The no-op job type with an optional target that `hot_target.py` and `drain_cg.py` drain.

Imported inside a benchmark's child process, once the tree under test is first on ``sys.path``:
the classes are made by ``hot_noop()`` so that importing this module loads no tether.
"""

from __future__ import annotations

from typing import Any


def hot_noop() -> tuple[Any, Any]:
    """``(HotNoop, HotNoopType)``: a payload ``n`` with an optional target ``key``, run as nothing."""
    from typing import ClassVar

    from tether import JobContext, JobType, Payload

    class HotNoop(Payload):
        job_type: ClassVar[str] = "bench_hot"
        n: int
        key: str | None = None

    class HotNoopType(JobType[HotNoop]):
        name = "bench_hot"
        payload_model = HotNoop

        def ordering_key(self, payload: HotNoop) -> str | None:
            return payload.key

        def run(self, payload: HotNoop, ctx: JobContext) -> None:
            return None

    return HotNoop, HotNoopType
