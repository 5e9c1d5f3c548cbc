"""What a finished attempt leaves in the ledger: its result as JSON, or its error as text."""

from __future__ import annotations

import traceback
from typing import Any

import orjson

from .errors import PermanentError, TetherError


def error_text(exc: BaseException) -> str:
    """What goes into ``last_error``: ``ExceptionType: message`` first, which is the line that
    ``failed``, ``jobs``, ``recent`` and the events show; for an error that is not tether's own the
    traceback follows on the next lines, for ``tether show`` (NUL bytes written as \\0:
    PostgreSQL text cannot hold them)."""
    try:
        message = str(exc).strip()
    except Exception:  # an exception whose __str__ fails still gets its type on the first line
        message = "<message unavailable>"
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if isinstance(exc, TetherError):
        text = head
    else:
        text = head.split("\n", 1)[0] + "\n" + "".join(traceback.format_exception(exc, limit=20)).rstrip()
    return text.replace("\x00", "\\0")


def encode_result(job_type: str, result: Any) -> str | None:
    """A handler's result as stored JSON; one that cannot be encoded is the handler's error."""
    if result is None:
        return None
    try:
        return orjson.dumps(result).decode()
    except TypeError as e:
        raise PermanentError(f"{job_type} handler returned a result that is not JSON: {e}") from e
