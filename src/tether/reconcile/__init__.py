"""The ledger against the world: the check (``check``), the drift report it returns
(``drift``), the last verdicts kept (``runs``).

The names of the old ``tether.reconcile`` module are imported from ``check`` when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .check import DRIFT, STATUSES, Finding, Report, count_targeted_jobs, reconcile

_WHERE = {
    "DRIFT": ".check",
    "Finding": ".check",
    "Report": ".check",
    "STATUSES": ".check",
    "count_targeted_jobs": ".check",
    "reconcile": ".check",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


__all__ = [
    "DRIFT",
    "Finding",
    "Report",
    "STATUSES",
    "count_targeted_jobs",
    "reconcile",
]
