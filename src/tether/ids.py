"""Job ids: ULIDs, strictly increasing within a process so id order is enqueue order."""

from __future__ import annotations

import base64
import random
import threading
from datetime import datetime

_lock = threading.Lock()
_last = 0
_random = random.SystemRandom()
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _CROCKFORD.encode())


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
    # base32 in C: 160 bits are 32 characters, the last 26 of which are the ULID's 130 bits;
    # only the alphabet differs from RFC 4648's.
    return base64.b32encode(candidate.to_bytes(20, "big"))[6:].translate(_TO_CROCKFORD).decode()
