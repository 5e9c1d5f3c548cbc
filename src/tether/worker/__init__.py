"""Running jobs: the worker loop (``loop``) and retry backoff (``retry``).

``from tether.worker import Worker`` still works: the names of the old ``tether.worker`` module
are imported from ``loop`` when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy

if TYPE_CHECKING:
    from .loop import Returned, Worker, WorkerConfig

_WHERE = {
    "Returned": ".loop",
    "Worker": ".loop",
    "WorkerConfig": ".loop",
}


__getattr__ = lazy.exports(__name__, _WHERE)


__all__ = [
    "Returned",
    "Worker",
    "WorkerConfig",
]
