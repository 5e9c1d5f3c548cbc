"""Job ids: ULIDs, strictly increasing within a process so id order is enqueue order."""

from __future__ import annotations

import threading
from datetime import datetime

from ulid import ULID

_lock = threading.Lock()
_last = 0


def new_id(now: datetime) -> str:
    """A ULID for ``now``; if the clock has not moved on, the previous id plus one."""
    global _last
    candidate = int(ULID.from_datetime(now))
    with _lock:
        if candidate <= _last:
            candidate = _last + 1
        _last = candidate
    return str(ULID.from_int(candidate))
