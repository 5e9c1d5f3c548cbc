"""Lifecycle events: one JSON line each on the ``tether.events`` logger.

Fields are ids, types, attempts, workers, durations, paths and sizes; never payload contents.
Where the command line prints them, one rule: a command whose stdout is its log (``tether
worker``) prints them on stdout; a command whose stdout is data (ids, a report, JSON) prints
them on stderr.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import orjson

logger = logging.getLogger("tether.events")


enabled: Callable[[], bool] = partial(logger.isEnabledFor, logging.INFO)
"""Whether events are being logged (callers skip building fields that would be dropped); a
partial rather than a function, since every enqueue asks and every frame there counts."""


def emit(event: str, **fields: Any) -> None:
    if logger.isEnabledFor(logging.INFO):
        fields = {"event": event, **{k: v for k, v in fields.items() if v is not None}}
        logger.info(orjson.dumps(fields, default=str).decode())


class _Lines(logging.Handler):
    """Writes each event to the *current* ``sys.stderr`` or ``sys.stdout`` (which test runners
    and CLIs swap), flushed: a log read while the worker runs."""

    _tether = True

    def __init__(self, stream: str) -> None:
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = getattr(sys, self.stream)
            stream.write(record.getMessage() + "\n")
            stream.flush()
        except Exception:  # a closed or broken stream must never break a job
            self.handleError(record)


def to_stdout(enabled: bool = True, level: int = logging.INFO) -> contextlib.AbstractContextManager[None]:
    """Print events on stdout for the length of a block (a command whose stdout is its log)."""
    return _printing("stdout", enabled, level)


def to_stderr(enabled: bool = True, level: int = logging.INFO) -> contextlib.AbstractContextManager[None]:
    """Print events on stderr for the length of a block (a command whose stdout is data)."""
    return _printing("stderr", enabled, level)


@contextmanager
def _printing(stream: str, enabled: bool, level: int) -> Iterator[None]:
    if not enabled or any(getattr(h, "_tether", False) for h in logger.handlers):
        yield
        return
    handler = _Lines(stream)
    previous = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous[0])
        logger.propagate = previous[1]
