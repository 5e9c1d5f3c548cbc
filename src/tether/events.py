"""Lifecycle events: one JSON line each on the ``tether.events`` logger.

Fields are ids, types, attempts, workers, durations, paths and sizes; never payload contents.
"""

from __future__ import annotations

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


class _StderrLines(logging.Handler):
    """Writes each event to the *current* ``sys.stderr`` (which test runners and CLIs swap)."""

    _tether = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(record.getMessage() + "\n")
        except Exception:  # a closed or broken stream must never break a job
            self.handleError(record)


@contextmanager
def to_stderr(enabled: bool = True, level: int = logging.INFO) -> Iterator[None]:
    """Print events on stderr for the length of a block (what CLI commands do), then stop."""
    if not enabled or any(getattr(h, "_tether", False) for h in logger.handlers):
        yield
        return
    handler = _StderrLines()
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
