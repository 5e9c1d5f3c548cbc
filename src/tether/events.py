"""Lifecycle events: one JSON line each on the ``tether.events`` logger.

Fields are ids, types, attempts, workers, durations, paths and sizes; never payload contents.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

logger = logging.getLogger("tether.events")


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


def log_to_stderr(level: int = logging.INFO) -> None:
    """Print events as JSON lines on stderr (what ``tether worker`` does)."""
    if any(getattr(h, "_tether", False) for h in logger.handlers):
        return
    logger.addHandler(_StderrLines())
    logger.setLevel(level)
    logger.propagate = False
