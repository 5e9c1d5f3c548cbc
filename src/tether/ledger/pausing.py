"""Paused job types: kept in the ledger (``tether_paused``), left out of every worker's claim.

An operator pauses a type (``tether pause``) and no worker claims its jobs until it is resumed;
jobs of it already running finish. A worker reads the table at most every ``REFRESH`` seconds,
in the claim's own transaction, and binds its registered types less the paused ones as CLAIM's
``types``: the claim's statement and plan stay exactly as they are, and a pause reaches every
worker, on any machine, within ``REFRESH`` seconds of its commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from .. import events
from ..clock import elapsed
from ..errors import ConfigError
from .schema import paused as paused_table

if TYPE_CHECKING:
    from .queue import Queue

REFRESH = 0.5
"""Seconds a worker goes on with the paused types it read last."""


class Pause(NamedTuple):
    """One paused type: since when, and the operator's reason."""

    job_type: str
    paused_at: datetime
    reason: str | None


def type_name(job_type: str) -> str:
    """``job_type`` as a paused type's name; ConfigError for one no job type could have."""
    name = job_type.strip()
    if not name or len(name) > 64:
        raise ConfigError(f"job type {job_type!r} is not a type name (1 to 64 characters)")
    return name


def pause(queue: Queue, job_type: str, reason: str | None) -> Pause:
    """Pause ``job_type`` (again: the reason and time are replaced)."""
    name, now = type_name(job_type), queue.clock.now()
    with queue.engine.begin() as conn:
        conn.execute(sa.delete(paused_table).where(paused_table.c.job_type == name))
        conn.execute(sa.insert(paused_table).values(job_type=name, reason=reason, paused_at=now))
    queue.claimer.paused.expire()
    events.emit("type_paused", type=name)
    return Pause(name, now, reason)


def resume(queue: Queue, job_type: str) -> bool:
    """Resume ``job_type``; False if it was not paused. Idle workers are woken to claim it."""
    name = type_name(job_type)
    with queue.engine.begin() as conn:
        removed = conn.execute(sa.delete(paused_table).where(paused_table.c.job_type == name)).rowcount
    queue.claimer.paused.expire()
    if removed:
        events.emit("type_resumed", type=name)
        queue.backend.transact(queue.wakeup.notify_in)
        queue.wakeup.wake_local()
    return bool(removed)


def paused(conn: sa.Connection) -> list[Pause]:
    """Every paused type, by name (for ``status``, ``jobs`` and the ui)."""
    query = sa.select(paused_table.c.job_type, paused_table.c.paused_at, paused_table.c.reason)
    return [Pause(*row) for row in conn.execute(query.order_by(paused_table.c.job_type))]


class PausedTypes:
    """A worker's view of the paused types, read again in a claim's transaction once it is
    ``REFRESH`` seconds old."""

    def __init__(self, statement: str) -> None:
        self._statement = statement
        self._types: frozenset[str] = frozenset()
        self._read_at: float | None = None

    def current(self, cur: Any) -> frozenset[str]:
        """The paused types, read through ``cur`` when the last read is stale."""
        now = elapsed()
        if self._read_at is None or now - self._read_at >= REFRESH:
            self._types = frozenset(name for (name,) in cur.rows(self._statement))
            self._read_at = now
        return self._types

    def expire(self) -> None:
        """Read again at the next claim (this process paused or resumed a type)."""
        self._read_at = None
