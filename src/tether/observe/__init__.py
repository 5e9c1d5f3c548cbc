"""The operator's questions, on read-only connections (``readonly``): the queries
(``queries``), the health verdict, Prometheus metrics, purge (``retention``).

The names of the old ``tether.observe`` module are imported from ``queries`` when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy

if TYPE_CHECKING:
    from .queries import (
        DuplicateGroup,
        Durations,
        DurationSample,
        ErrorGroup,
        JobFilter,
        JobPage,
        Recent,
        Spend,
        Stats,
        Stuck,
        TypeBacklog,
        children,
        counts,
        duplicates,
        duration_sample,
        durations,
        error_summary,
        failed,
        failed_by_error,
        jobs,
        jobs_page,
        on_target,
        percentile,
        recent,
        resolve_id,
        seconds_between,
        show,
        spend,
        stats,
        stuck,
    )

_WHERE = {
    "DuplicateGroup": ".queries",
    "Durations": ".queries",
    "DurationSample": ".queries",
    "ErrorGroup": ".queries",
    "JobFilter": ".queries",
    "JobPage": ".queries",
    "Recent": ".queries",
    "Spend": ".queries",
    "Stats": ".queries",
    "Stuck": ".queries",
    "TypeBacklog": ".queries",
    "children": ".queries",
    "counts": ".queries",
    "duplicates": ".queries",
    "duration_sample": ".queries",
    "durations": ".queries",
    "error_summary": ".queries",
    "failed": ".queries",
    "failed_by_error": ".queries",
    "jobs": ".queries",
    "jobs_page": ".queries",
    "on_target": ".queries",
    "percentile": ".queries",
    "recent": ".queries",
    "resolve_id": ".queries",
    "seconds_between": ".queries",
    "show": ".queries",
    "spend": ".queries",
    "stats": ".queries",
    "stuck": ".queries",
}


__getattr__ = lazy.exports(__name__, _WHERE)


__all__ = [
    "DuplicateGroup",
    "Durations",
    "DurationSample",
    "ErrorGroup",
    "JobFilter",
    "JobPage",
    "Recent",
    "Spend",
    "Stats",
    "Stuck",
    "TypeBacklog",
    "children",
    "counts",
    "duplicates",
    "duration_sample",
    "durations",
    "error_summary",
    "failed",
    "failed_by_error",
    "jobs",
    "jobs_page",
    "on_target",
    "percentile",
    "recent",
    "resolve_id",
    "seconds_between",
    "show",
    "spend",
    "stats",
    "stuck",
]
