"""The charts: bar geometry for inline SVGs drawn by the templates (no script)."""

from __future__ import annotations

from dataclasses import dataclass

from ..observe.durations import Durations
from ..observe.throughput import Minute

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


THROUGHPUT_HEIGHT = 60


@dataclass(frozen=True)
class Column:
    x: int
    label: str
    completed: int
    failed: int
    h_completed: float
    h_failed: float


@dataclass(frozen=True)
class Columns:
    columns: list[Column]
    peak: int
    """Jobs in the busiest minute: the top of the scale."""
    height: int = THROUGHPUT_HEIGHT
    step: int = 9


def throughput_columns(minutes: list[Minute]) -> Columns:
    """One column per minute, failed stacked on completed, on a scale up to the busiest minute."""
    peak = max((m.completed + m.failed for m in minutes), default=0)
    scale = THROUGHPUT_HEIGHT / (peak or 1)
    columns = [
        Column(
            i * 9,
            m.start.strftime("%H:%M"),
            m.completed,
            m.failed,
            round(m.completed * scale, 1),
            round(m.failed * scale, 1),
        )
        for i, m in enumerate(minutes)
    ]
    return Columns(columns, peak)
