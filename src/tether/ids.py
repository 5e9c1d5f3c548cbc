"""Job ids: ULIDs, strictly increasing within a process so id order is enqueue order."""

from __future__ import annotations

import os
import random
import threading
from datetime import datetime

_lock = threading.Lock()
_last = ""  # the last id handed out in this process
# Mersenne Twister seeded from the OS (a SystemRandom draw is a syscall: half an id's cost),
# reseeded in a forked child so two processes never share a sequence.
_random = random.Random()


def _after_fork_in_child() -> None:
    global _last
    _random.seed()
    _last = ""  # else parent and child could both hand out the same next id within one millisecond


os.register_at_fork(after_in_child=_after_fork_in_child)
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Two characters per 10 bits: a ULID's 130 bits (two leading zeros) are 13 look-ups.
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
# A random byte's low 5 bits as a character: 16 random bytes are the 80 random bits of an id,
# in four C calls instead of 8 look-ups and 8 concatenations (an enqueue's hottest Python).
_CHAR_OF_BYTE = bytes.maketrans(bytes(range(256)), bytes(ord(_CROCKFORD[b & 31]) for b in range(256)))
_AS_BASE32 = str.maketrans(_CROCKFORD, "0123456789abcdefghijklmnopqrstuv")  # for int(text, 32)
_time_part: tuple[int, str] = (-1, "")  # the last millisecond encoded, and its 10 characters


def _ms(when: datetime) -> int:
    return int(when.timestamp()) * 1000 + when.microsecond // 1000  # exact, unlike timestamp() * 1000


def floor_id(when: datetime) -> str:
    """The smallest id of ``when``'s millisecond: ``id >= floor_id(t)`` selects jobs created
    since ``t`` by primary key."""
    return _encode(_ms(when) << 80)


def new_id(now: datetime) -> str:
    """A ULID for ``now`` (48-bit milliseconds, 80 random bits); if that is not after the last
    id (the clock has not moved on, or went back), the last id plus one."""
    global _last, _time_part
    ms = int(now.timestamp()) * 1000 + now.microsecond // 1000  # _ms, inline: the hot path
    cached = _time_part
    if cached[0] != ms:  # _time_chars, inline: after a commit's fsync the millisecond has moved on
        p = _PAIRS
        chars = p[(ms >> 40) & 1023] + p[(ms >> 30) & 1023] + p[(ms >> 20) & 1023] + p[(ms >> 10) & 1023] + p[ms & 1023]
        cached = _time_part = (ms, chars)
    candidate = cached[1] + _random.getrandbits(128).to_bytes(16, "little").translate(_CHAR_OF_BYTE).decode()
    with _lock:
        if candidate <= _last:  # fixed width, alphabet in ASCII order: text order is number order
            candidate = _encode(int(_last.translate(_AS_BASE32), 32) + 1)
        _last = candidate
    return candidate


def new_ids(now: datetime, n: int) -> list[str]:
    """``n`` increasing ids for ``now``: one random start, then consecutive values, as ``new_id``
    does within one millisecond (jobs enqueued in one call)."""
    global _last
    start = (_ms(now) << 80) | _random.getrandbits(80)
    with _lock:
        last = int(_last.translate(_AS_BASE32), 32) if _last else -1
        if start <= last:
            start = last + 1
        _last = _encode(start + n - 1)
    ids: list[str] = []
    value, end = start, start + n
    while value < end:  # per run of values that share all but their last 10 bits: encode once
        stop = min(end, (value | 1023) + 1)
        head = _encode(value)[:-2]
        ids.extend([head + pair for pair in _PAIRS[value & 1023 : ((stop - 1) & 1023) + 1]])
        value = stop
    return ids


def _time_chars(ms: int) -> str:
    """The first 10 characters of an id: its 48-bit millisecond (with two leading zero bits)."""
    p = _PAIRS
    return p[(ms >> 40) & 1023] + p[(ms >> 30) & 1023] + p[(ms >> 20) & 1023] + p[(ms >> 10) & 1023] + p[ms & 1023]


def _encode(value: int) -> str:
    p = _PAIRS
    return (
        _time_chars(value >> 80)
        + p[(value >> 70) & 1023]
        + p[(value >> 60) & 1023]
        + p[(value >> 50) & 1023]
        + p[(value >> 40) & 1023]
        + p[(value >> 30) & 1023]
        + p[(value >> 20) & 1023]
        + p[(value >> 10) & 1023]
        + p[value & 1023]
    )
