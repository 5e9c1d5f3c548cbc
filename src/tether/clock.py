"""Time, injected: nothing in tether reads the wall clock except through a ``Clock``."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol


class Clock(Protocol):
    """Something that tells the current UTC time."""

    def now(self) -> datetime: ...


class SystemClock:
    """The real clock (timezone-aware UTC)."""

    # datetime.now(timezone.utc) without a Python frame of its own: every enqueue reads it.
    now = staticmethod(partial(datetime.now, UTC))


class FakeClock:
    """A clock tests move by hand: ``clock.advance(seconds=310)``."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0, **kwargs: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds, **kwargs)
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when
