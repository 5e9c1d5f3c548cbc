"""The ledger against the world: the check (``check``), the drift report it returns
(``drift``), the last verdicts kept (``runs``).

The names of the old ``tether.reconcile`` module are imported from ``check`` when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy

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


__getattr__ = lazy.exports(__name__, _WHERE)


__all__ = [
    "DRIFT",
    "Finding",
    "Report",
    "STATUSES",
    "count_targeted_jobs",
    "reconcile",
]
