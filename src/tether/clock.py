"""Time, injected: nothing in tether reads the wall clock except through a ``Clock``.

On SQLite every process that shares a ledger runs on one machine and reads its one wall clock
(``SystemClock``). On PostgreSQL workers on several machines share the ledger, and a machine's
clock can be minutes off (a broken NTP); a lock's age compared across two clocks that disagree
frees a live job or keeps a dead one. There the ledger's times come from the database's clock
(``DatabaseClock``), which every machine reads alike.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol

from . import events


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


# Seconds elapsed on a counter that no step of the wall clock moves (the machine's own clock being
# set, by hand or by NTP). Linux's boot-time counter also keeps counting while the machine is
# suspended, which the monotonic one does not.
elapsed: Callable[[], float] = (
    partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
)

SKEW_REPORTED = 1.0
"""A ``clock_skew`` event is logged when the machine's clock is found this many seconds further
from the database's than it was last reported (first against zero)."""


class DatabaseClock:
    """The database's clock, as a ledger several machines share reads it (PostgreSQL).

    ``sync(read)`` reads the database's time (``read`` returns it: the ledger passes a query run
    in a transaction it holds) and pins it to the elapsed-time counter; ``now()`` is that reading
    advanced by the time elapsed since. So ``now()`` costs no round trip, agrees with every other
    machine's to within the round trips of their last syncs (and the drift of each machine's
    counter since), and no step of this machine's wall clock moves it. The ledger syncs it when
    it opens and in each stale sweep and heartbeat, which then measure lock ages by the time they
    just read. A sync may set it back by less than half the round trip it was read in.

    ``machine`` is this machine's own clock, read only when syncing, to report how far off it is
    (the ``clock_skew`` event, and ``machine_ahead``)."""

    def __init__(self, machine: Clock | None = None) -> None:
        self.machine = machine or SystemClock()
        self.machine_ahead = 0.0
        """Seconds the machine's clock was ahead of the database's at the last sync (negative: behind)."""
        self._reported = 0.0
        self._base: tuple[datetime, float] | None = None  # (the database's time, elapsed() then)

    @property
    def synced(self) -> bool:
        return self._base is not None

    def now(self) -> datetime:
        base = self._base  # one read: a sync may replace it meanwhile
        if base is None:
            raise RuntimeError("DatabaseClock.now() before its first sync()")
        return base[0] + timedelta(0, elapsed() - base[1])  # positional: bound faster than seconds=

    def sync(self, read: Callable[[], datetime]) -> datetime:
        """Read the database's time through ``read`` and go on from it; returns it (UTC)."""
        before = elapsed()
        at = read().astimezone(UTC)
        after = elapsed()
        # Read at some instant of the round trip: its middle is off by at most half of it.
        self._base = (at, (before + after) / 2)
        ahead = (self.machine.now() - self.now()).total_seconds()
        self.machine_ahead = ahead
        if abs(ahead - self._reported) >= SKEW_REPORTED:
            self._reported = ahead
            events.emit("clock_skew", machine_ahead_s=round(ahead, 3))
        return at
