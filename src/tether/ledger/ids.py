"""Job ids: ULIDs, strictly increasing within a process so id order is enqueue order."""

from __future__ import annotations

import os
import random
import threading
from datetime import UTC, datetime, timedelta

_lock = threading.Lock()
# The last id handed out in this process, and the millisecond its first 10 characters encode.
# Within one millisecond the next id is this one plus one: monotonic ULIDs, as the
# ULID spec has them, and cheaper than a random draw (two characters change, nothing is parsed).
_last: tuple[int, str] = (-1, "")
# Mersenne Twister seeded from the OS (a SystemRandom draw is a syscall, dearer than the rest of an id),
# reseeded in a forked child so two processes never share a sequence.
_random = random.Random()


def _after_fork_in_child() -> None:
    global _last
    _random.seed()
    _last = (-1, "")  # else parent and child would both hand out the last id plus one


os.register_at_fork(after_in_child=_after_fork_in_child)
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Two characters per 10 bits: a ULID's 130 bits (two leading zeros) are 13 look-ups.
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]
# Each pair's successor: an id plus one is its last two characters replaced, unless they are
# "ZZ" (maps to "": the addition carries into the characters before them).
_NEXT_PAIR = dict(zip(_PAIRS, [*_PAIRS[1:], ""], strict=True))
# A random byte's low 5 bits as a character: 16 random bytes are the 80 random bits of an id,
# in four C calls instead of 8 look-ups and 8 concatenations (an enqueue's hottest Python).
_CHAR_OF_BYTE = bytes.maketrans(bytes(range(256)), bytes(ord(_CROCKFORD[b & 31]) for b in range(256)))
_AS_BASE32 = str.maketrans(_CROCKFORD, "0123456789abcdefghijklmnopqrstuv")  # for int(text, 32)
# The first 8 characters of the ids of 1024 milliseconds (ms >> 10): after a commit's fsync the
# millisecond has moved on, but rarely its 1024-millisecond block.
_head: tuple[int, str] = (-1, "")
# The UTC second of the last id, [start, end), and its first millisecond: an id's millisecond
# without ``timestamp()`` (a timedelta, and float and big-integer arithmetic, per id).
_second: tuple[datetime, datetime, int] = (datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC), 0)
_ONE_SECOND = timedelta(seconds=1)


def _ms(when: datetime) -> int:
    if when.tzinfo is not UTC:  # naive (local time), or a zone whose offset may hold microseconds
        when = when.astimezone(UTC)
    return int(when.timestamp()) * 1000 + when.microsecond // 1000  # exact, unlike timestamp() * 1000


def floor_id(when: datetime) -> str:
    """The smallest id of ``when``'s millisecond: ``id >= floor_id(t)`` selects jobs created
    since ``t`` by primary key."""
    return _encode(_ms(when) << 80)


def new_id(now: datetime) -> str:
    """A ULID for ``now`` (48-bit milliseconds, 80 random bits); within the millisecond of the
    last id, or if the clock went back, the last id plus one."""
    global _last, _head, _second
    second = _second
    if now.tzinfo is UTC and second[0] <= now < second[1]:  # the clock's own zone, in the last id's second
        ms = second[2] + now.microsecond // 1000
    else:
        ms = _ms(now)
        if now.tzinfo is UTC:
            start = now.replace(microsecond=0)
            _second = (start, start + _ONE_SECOND, ms - now.microsecond // 1000)
    with _lock:
        last_ms, last = _last
        if ms > last_ms:
            head = _head
            if head[0] != ms >> 10:
                head = _head = (ms >> 10, _time_chars(ms)[:8])
            new = (
                head[1]
                + _PAIRS[ms & 1023]
                + _random.getrandbits(128).to_bytes(16, "little").translate(_CHAR_OF_BYTE).decode()
            )
            _last = (ms, new)
            return new
        following = _NEXT_PAIR[last[-2:]]
        if following:
            new = last[:-2] + following
            _last = (last_ms, new)
            return new
        value = int(last.translate(_AS_BASE32), 32) + 1  # the carry: once in 1024 ids at most
        new = _encode(value)
        _last = (value >> 80, new)  # a carry out of the random bits moves the millisecond on
        return new


def new_ids(now: datetime, n: int) -> list[str]:
    """``n`` increasing ids for ``now``: one random start, then consecutive values, as ``new_id``
    does within one millisecond (jobs enqueued in one call)."""
    global _last
    start = (_ms(now) << 80) | _random.getrandbits(80)
    with _lock:
        last = int(_last[1].translate(_AS_BASE32), 32) if _last[1] else -1
        if start <= last:
            start = last + 1
        end = start + n
        _last = ((end - 1) >> 80, _encode(end - 1))
    ids: list[str] = []
    value = start
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
