"""The durations chart: bar geometry for an inline SVG drawn by the template (no script)."""

from __future__ import annotations

from dataclasses import dataclass

from ..observe.durations import Durations

WIDTH = 560  # the bars' area in SVG units, right of the type names
ROW = 22


@dataclass(frozen=True)
class Bar:
    type: str
    y: int
    p50: float
    p95: float
    p99: float
    w50: float
    w95: float
    w99: float


@dataclass(frozen=True)
class Bars:
    bars: list[Bar]
    scale: float
    """Seconds at the right edge: the largest p99, so every bar is to one scale."""
    height: int
    width: int = WIDTH


def duration_bars(found: list[Durations]) -> Bars:
    """One row per type: p99 behind p95 behind p50, as nested bars on a shared linear scale."""
    scale = max((d.p99 for d in found), default=0.0) or 1.0
    bars = [
        Bar(
            d.type,
            i * ROW,
            d.p50,
            d.p95,
            d.p99,
            round(WIDTH * d.p50 / scale, 1),
            round(WIDTH * d.p95 / scale, 1),
            round(WIDTH * d.p99 / scale, 1),
        )
        for i, d in enumerate(found)
    ]
    return Bars(bars, scale, max(1, len(bars)) * ROW + 20)
