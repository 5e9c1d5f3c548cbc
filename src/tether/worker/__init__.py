"""Running jobs: the worker loop (``loop``) and retry backoff (``retry``).

``from tether.worker import Worker`` still works: the names of the old ``tether.worker`` module
are imported from ``loop`` when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import Returned, Worker, WorkerConfig

_WHERE = {
    "Returned": ".loop",
    "Worker": ".loop",
    "WorkerConfig": ".loop",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


__all__ = [
    "Returned",
    "Worker",
    "WorkerConfig",
]
