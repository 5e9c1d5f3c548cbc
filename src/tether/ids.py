"""Job ids: ULIDs, strictly increasing within a process so id order is enqueue order."""

from __future__ import annotations

import random
import threading
from datetime import datetime

_lock = threading.Lock()
_last = 0
_random = random.SystemRandom()
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id(now: datetime) -> str:
    """A ULID for ``now`` (48-bit milliseconds, 80 random bits); if the clock has not moved on,
    the previous id plus one."""
    global _last
    ms = int(now.timestamp()) * 1000 + now.microsecond // 1000  # exact, unlike timestamp() * 1000
    candidate = (ms << 80) | _random.getrandbits(80)
    with _lock:
        if candidate <= _last:
            candidate = _last + 1
        _last = candidate
    return "".join(_CROCKFORD[(candidate >> shift) & 31] for shift in range(125, -1, -5))
