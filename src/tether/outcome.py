"""What a finished attempt leaves in the ledger: its result as JSON, or its error as text."""

from __future__ import annotations

import traceback
from typing import Any

import orjson

from .errors import PermanentError, TetherError


def error_text(exc: BaseException) -> str:
    """What goes into ``last_error``: the message, plus the traceback for unexpected errors
    (NUL bytes written as \\0: PostgreSQL text cannot hold them)."""
    if isinstance(exc, TetherError):
        text = f"{type(exc).__name__}: {exc}"
    else:
        text = "".join(traceback.format_exception(exc, limit=20)).rstrip()
    return text.replace("\x00", "\\0")


def encode_result(job_type: str, result: Any) -> str | None:
    """A handler's result as stored JSON; one that cannot be encoded is the handler's error."""
    if result is None:
        return None
    try:
        return orjson.dumps(result).decode()
    except TypeError as e:
        raise PermanentError(f"{job_type} handler returned a result that is not JSON: {e}") from e
