"""What a job may hold: the limits checked at enqueue, so nothing is accepted that can never run.

Each limit lives here once. A payload is refused (``InvalidPayload`` naming the field) when its
stored JSON is larger than ``max_payload_bytes``, nested deeper than ``MAX_DEPTH``, or holds a
string that is not valid Unicode (a lone surrogate cannot be written as UTF-8). Priorities and
attempt counts must fit the ledger's 32-bit integer columns; a delay must be a finite number of
seconds, not negative, whose run time a date can hold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import orjson
from pydantic import BaseModel

from .. import config

DEFAULT_MAX_PAYLOAD_BYTES = config.DEFAULT_MAX_PAYLOAD_BYTES
"""Largest stored payload (its JSON, in bytes) by default: ``TETHER_MAX_PAYLOAD_BYTES`` or
``Coordinator.open(max_payload_bytes=...)`` change it (``tether.config``)."""

MAX_DEPTH = 64
"""Deepest JSON nesting of a payload, its own object counted as one level. The JSON parser that
reads a payload back at run time refuses a little over a hundred levels; 64 leaves room."""

INT_MIN, INT_MAX = -(2**31), 2**31 - 1  # INTEGER on PostgreSQL
# bytes that are not brackets, quotes or backslashes: deleted to leave a payload's skeleton
_NOT_SKELETON = bytes(b for b in range(256) if b not in b'[]{}"\\')
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


def check_int(field: str, value: Any, low: int) -> str | None:
    """A problem with an integer option (``field: ...``), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{field}: must be an integer, got {type(value).__name__}"
    if not low <= value <= INT_MAX:
        return f"{field}: must be between {low} and {INT_MAX}, got {value}"
    return None


def option_problem(priority: Any, max_attempts: Any, delay: Any, now: datetime) -> str | None:
    """What is wrong with a job's options (``field: rule``), or None."""
    problem = check_int("priority", priority, INT_MIN) or check_int("max_attempts", max_attempts, 1)
    if problem is None and delay is not None:
        try:
            delay_until(now, delay)
        except ValueError as e:
            problem = f"delay: {e}"
    return problem


def delay_until(now: datetime, delay: float | timedelta) -> datetime:
    """``now + delay``; ValueError with the rule if the delay is not a finite number of seconds
    >= 0 or lands past what a date can hold."""
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise ValueError(f"must be a number of seconds, got {type(delay).__name__}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"must be a number of seconds >= 0, got {delay}")
    try:
        return now + (delay if isinstance(delay, timedelta) else timedelta(seconds=seconds))
    except (OverflowError, ValueError):
        raise ValueError(f"{delay} seconds from now is past the last date a run time can hold") from None


def payload_problem(encoded: bytes, max_bytes: int) -> str | None:
    """What makes a stored payload too big or too deep (``field: rule``), or None. Cheap for
    the common payload: a length and two counts, unless it has more than MAX_DEPTH brackets."""
    if len(encoded) > max_bytes:
        sizes = {name: len(orjson.dumps(value)) for name, value in orjson.loads(encoded).items()}
        field = max(sizes, key=sizes.__getitem__, default="(payload)")
        return (
            f"{field}: the payload is {len(encoded)} bytes of JSON, most of them here; at most {max_bytes} "
            "are allowed (TETHER_MAX_PAYLOAD_BYTES)"
        )
    if encoded.count(b"[") + encoded.count(b"{") <= MAX_DEPTH or _depth(encoded) <= MAX_DEPTH:
        return None
    # Name the field: the payload parses (its encoder nests at most ~250 deep, orjson reads 1024).
    for name, value in orjson.loads(encoded).items():
        if 1 + _depth(orjson.dumps(value), MAX_DEPTH) > MAX_DEPTH:
            return f"{name}: JSON nested more than {MAX_DEPTH} levels deep (the payload's own object counts as one)"
    return f"(payload): JSON nested more than {MAX_DEPTH} levels deep"


def _depth(encoded: bytes, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of JSON text, or ``limit + 1`` if it is deeper (brackets inside
    strings do not count). All at C speed: strings are cut out of the text's skeleton (its
    brackets and quotes), then each pass deletes the innermost pairs."""
    skeleton = encoded.translate(None, _NOT_SKELETON)
    if b"\\" in skeleton:  # escapes: cut the strings out of the text itself
        skeleton = _STRING.sub(b"", encoded).translate(None, _NOT_SKELETON)
    else:
        # Without escapes a string is its two quotes around any brackets it holds; adjacent
        # quotes close one string and open the next (with no bracket between), or are one empty
        # string: either way deleting them leaves the others paired.
        skeleton = skeleton.replace(b'""', b"")
        if b'"' in skeleton:
            skeleton = _STRING.sub(b"", skeleton)
    # Valid JSON pairs its brackets by kind, so for depth one kind will do; each pass deletes the
    # innermost pairs (replace never rescans what it joined).
    skeleton = skeleton.translate(_ONE_KIND)
    for depth in range(limit + 1):
        if not skeleton:
            return depth
        skeleton = skeleton.replace(b"[]", b"")
    return limit + 1


def unencodable_strings(value: Any, where: str = "") -> Iterator[str]:
    """Dotted paths of the strings (keys included) in ``value`` that are not valid Unicode; for
    naming the field after an encoder refused a payload (never on the fast path)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            code = ord(value[e.start])
            yield f"{where or '(payload)'}: holds a lone surrogate (U+{code:04X}), which is not valid Unicode"
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(key, str):
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError:
                    yield f"{where or '(payload)'}: a key holds a lone surrogate, which is not valid Unicode"
                    continue
            yield from unencodable_strings(item, path)
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from unencodable_strings(getattr(value, name), f"{where}.{name}" if where else name)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from unencodable_strings(item, f"{where}.{i}" if where else str(i))
