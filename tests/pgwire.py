"""What a coordinator's kept PostgreSQL connection sends and receives, read from libpq's trace:
the tests of tether's pipelined transactions count their round trips and statements with it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq

from tether import Coordinator
from tether.ledger.postgresql import PostgresBackend


def kept_connection(c: Coordinator) -> psycopg.Connection:
    """The connection pipelined transactions run on, idle between them (one at a time here)."""
    backend = c.queue.backend
    assert isinstance(backend, PostgresBackend)
    [driver] = backend._idle
    return driver


def traced(c: Coordinator, path: Path, run: Callable[[], Any]) -> tuple[Any, list[list[str]]]:
    """What ``run()`` returns, and the protocol messages it exchanged on the kept connection
    (libpq's trace), split in fields: direction, length, message type, contents."""
    driver = kept_connection(c)
    with path.open("w") as out:
        driver.pgconn.trace(out.fileno())
        driver.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            result = run()
        finally:
            driver.pgconn.untrace()
    return result, [line.split("\t") for line in path.read_text().splitlines()]


def round_trips(messages: list[list[str]]) -> int:
    """How often the client waited for the server: each turn from sending to receiving."""
    directions = [m[0] for m in messages if m[0] in ("F", "B")]
    return sum(1 for sent, got in zip(directions, directions[1:], strict=False) if sent == "F" and got == "B")


def sent_statements(messages: list[list[str]]) -> list[str]:
    """The text of each statement sent (each is parsed once here: none is prepared yet)."""
    parsed = [m[3] for m in messages if m[0] == "F" and m[2] == "Parse"]
    return [next(word for word in text.split('"') if word.strip()) for text in parsed]


def statements(messages: list[list[str]]) -> list[str]:
    """The first word of each statement sent."""
    return [text.split()[0] for text in sent_statements(messages)]
