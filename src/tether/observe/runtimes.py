"""Run times of completed jobs (claimed_at -> completed_at, seconds) by type, and their
nearest-rank percentiles. No SQLAlchemy: ``durations`` and ``tether status`` on either path
read their rows here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def run_times_of(rows: Iterable[Any]) -> dict[str, list[float]]:
    """``(type, seconds)`` rows as each type's run times."""
    by_type: dict[str, list[float]] = {}
    for name, value in rows:
        # Millisecond resolution: julianday() arithmetic is only good to ~50 µs.
        by_type.setdefault(name, []).append(max(0.0, round(float(value), 3)))
    return by_type


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]
