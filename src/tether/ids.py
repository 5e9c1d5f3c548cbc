"""Job ids: ULIDs, strictly increasing within a process so id order is enqueue order."""

from __future__ import annotations

import os
import random
import threading
from datetime import datetime

_lock = threading.Lock()
_last = 0
# Mersenne Twister seeded from the OS (a SystemRandom draw is a syscall: half an id's cost),
# reseeded in a forked child so two processes never share a sequence.
_random = random.Random()


def _after_fork_in_child() -> None:
    global _last
    _random.seed()
    _last = 0  # else parent and child could both hand out _last + 1 within one millisecond


os.register_at_fork(after_in_child=_after_fork_in_child)
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Two characters per 10 bits: a ULID's 130 bits (two leading zeros) are 13 look-ups.
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
_prefix: tuple[int, str] = (-1, "")  # the time part of the last id, encoded


def _ms(when: datetime) -> int:
    return int(when.timestamp()) * 1000 + when.microsecond // 1000  # exact, unlike timestamp() * 1000


def floor_id(when: datetime) -> str:
    """The smallest id of ``when``'s millisecond: ``id >= floor_id(t)`` selects jobs created
    since ``t`` by primary key."""
    return _encode(_ms(when) << 80)


def new_id(now: datetime) -> str:
    """A ULID for ``now`` (48-bit milliseconds, 80 random bits); if the clock has not moved on,
    the previous id plus one."""
    global _last
    candidate = (_ms(now) << 80) | _random.getrandbits(80)
    with _lock:
        if candidate <= _last:
            candidate = _last + 1
        _last = candidate
    return _encode(candidate)


def new_ids(now: datetime, n: int) -> list[str]:
    """``n`` increasing ids for ``now``: one random start, then consecutive values, as ``new_id``
    does within one millisecond (jobs enqueued in one call)."""
    global _last
    if n == 1:
        return [new_id(now)]
    start = (_ms(now) << 80) | _random.getrandbits(80)
    with _lock:
        if start <= _last:
            start = _last + 1
        _last = start + n - 1
    ids: list[str] = []
    value, end = start, start + n
    while value < end:  # per run of values that share all but their last 10 bits: encode once
        stop = min(end, (value | 1023) + 1)
        head = _encode(value)[:-2]
        ids.extend([head + pair for pair in _PAIRS[value & 1023:((stop - 1) & 1023) + 1]])
        value = stop
    return ids


def _encode(value: int) -> str:
    global _prefix
    high, low = value >> 80, value
    cached = _prefix
    if cached[0] != high:  # a new millisecond: its 10 characters, once
        cached = _prefix = (high, "".join(_PAIRS[(high >> shift) & 1023] for shift in (40, 30, 20, 10, 0)))
    p = _PAIRS
    return (cached[1] + p[(low >> 70) & 1023] + p[(low >> 60) & 1023] + p[(low >> 50) & 1023]
            + p[(low >> 40) & 1023] + p[(low >> 30) & 1023] + p[(low >> 20) & 1023] + p[(low >> 10) & 1023]
            + p[low & 1023])
