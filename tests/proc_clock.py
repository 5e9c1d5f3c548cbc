"""An --import module that sets a worker subprocess's machine clock wrong, as a machine whose NTP
is broken would have it (tests/test_clock_skew.py).

``tether --import tests.proc_clock ... worker`` with ``TETHER_TEST_CLOCK_SHIFT=<seconds>`` in its
environment: from ``register`` on, every reading of ``tether.clock.SystemClock`` in the process is
that many seconds ahead (negative: behind). It is imported before the ledger is opened, so the
coordinator, its queue, its worker and its schedules all see the shifted time wherever they read
the machine's clock. Without the variable it changes nothing.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from tether.clock import SystemClock

SHIFT_ENV = "TETHER_TEST_CLOCK_SHIFT"


def register(registry: Any) -> None:
    shift = float(os.environ.get(SHIFT_ENV) or 0)
    if not shift:
        return
    real = SystemClock.now
    offset = timedelta(seconds=shift)

    def shifted() -> datetime:
        return real() + offset

    SystemClock.now = staticmethod(shifted)  # the machine's clock, set wrong
