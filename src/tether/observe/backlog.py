"""The ledger's backlog at one instant (``Stats``): outstanding work by type, failures, stuck
locks, the deepest target; and how the rows of its queries become one.

No SQLAlchemy here: ``tether status`` builds these from the SQLAlchemy statements in ``health``
or, on a SQLite file, from the same statements compiled ahead (``lite``), and both read the
rows through ``stats_of``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..ledger.status import JobStatus


@dataclass(frozen=True)
class TypeBacklog:
    type: str
    pending: int = 0
    claimed: int = 0
    oldest_ready_at: datetime | None = None
    """When the longest-waiting pending job that may run now became ready (its ``run_at``)."""
    largest_payload: int | None = None
    """Bytes of the largest pending payload (stored JSON): what a worker will hold to run it.
    Jobs enqueued before tether kept payload sizes are not counted."""
    paused: bool = False
    """An operator paused the type (``tether pause``): no worker claims its pending jobs."""
    scheduled: int = 0
    """Pending jobs not due yet that never ran: enqueued with a delay, or a schedule's slot."""
    retrying: int = 0
    """Pending jobs not due yet that ran before: waiting out a retry's backoff (or a deferral).
    A manual retry resets the attempts, so a retried job counts as ready, not here."""

    @property
    def ready(self) -> int:
        """Pending jobs due now (blocked behind an older job on their target included)."""
        return self.pending - self.scheduled - self.retrying

    @property
    def outstanding(self) -> int:
        return self.pending + self.claimed


@dataclass(frozen=True)
class TargetBacklog:
    """One target's outstanding jobs: they run one at a time, in enqueue order (the deepest such
    backlog is what a hot target looks like)."""

    key: str
    """The target as stored (``ordering_key``), e.g. ``file:index.json``."""
    outstanding: int

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "outstanding": self.outstanding}


@dataclass(frozen=True)
class PausedType:
    """A job type an operator paused: since when, and why."""

    type: str
    paused_at: datetime | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "paused_at": self.paused_at.isoformat() if self.paused_at else None,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Stats:
    """The ledger at one instant: outstanding work by type, failures, stuck locks."""

    now: datetime
    lock_timeout: float
    by_type: list[TypeBacklog]
    failed: int
    stuck: int
    oldest_pending_at: datetime | None
    quarantined: int = 0  # outstanding jobs a worker died holding: each runs alone (reclaim.py)
    deepest_target: TargetBacklog | None = None  # the target with the most outstanding jobs
    paused: list[PausedType] = field(default_factory=list)  # types no worker claims, by name

    @property
    def pending(self) -> int:
        return sum(b.pending for b in self.by_type)

    @property
    def claimed(self) -> int:
        return sum(b.claimed for b in self.by_type)

    @property
    def outstanding(self) -> int:
        return self.pending + self.claimed

    @property
    def scheduled(self) -> int:
        return sum(b.scheduled for b in self.by_type)

    @property
    def retrying(self) -> int:
        return sum(b.retrying for b in self.by_type)

    @property
    def ready(self) -> int:
        return sum(b.ready for b in self.by_type)

    @property
    def running(self) -> int:
        """Claimed jobs whose worker still beats (the stuck ones are counted apart)."""
        return self.claimed - self.stuck

    @property
    def largest_pending_payload(self) -> int | None:
        """Bytes of the largest pending payload of any type (see TypeBacklog.largest_payload)."""
        return max((b.largest_payload for b in self.by_type if b.largest_payload is not None), default=None)

    @property
    def oldest_pending_age(self) -> float | None:
        """Seconds since the oldest pending job was enqueued (delayed jobs included)."""
        if self.oldest_pending_at is None:
            return None
        return max(0.0, (self.now - self.oldest_pending_at).total_seconds())

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "lock_timeout": self.lock_timeout,
            "pending": self.pending,
            "claimed": self.claimed,
            "outstanding": self.outstanding,
            "ready": self.ready,
            "scheduled": self.scheduled,
            "retrying": self.retrying,
            "running": self.running,
            "failed": self.failed,
            "stuck": self.stuck,
            "quarantined": self.quarantined,
            "deepest_target": None if self.deepest_target is None else self.deepest_target.to_dict(),
            "paused": [p.to_dict() for p in self.paused],
            "oldest_pending_at": self.oldest_pending_at.isoformat() if self.oldest_pending_at else None,
            "oldest_pending_age": self.oldest_pending_age,
            "largest_pending_payload": self.largest_pending_payload,
            "by_type": [
                {
                    **asdict(b),
                    "outstanding": b.outstanding,
                    "ready": b.ready,
                    "oldest_ready_at": b.oldest_ready_at.isoformat() if b.oldest_ready_at else None,
                }
                for b in self.by_type
            ],
        }


def utc(value: Any) -> datetime | None:
    """A time read through an aggregate (min, max): SQLite gives text, PostgreSQL a datetime."""
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)


def stats_of(
    now: datetime,
    lock_timeout: float,
    per_status: Iterable[Any],
    failed: int,
    stuck: int,
    quarantined: int,
    deepest: Any | None,
    paused: Iterable[Any] = (),
) -> Stats:
    """``Stats`` from the rows of the backlog queries: ``per_status`` rows of (type, status,
    count, oldest ready run_at, oldest created_at, largest payload_bytes), one per type and
    active status; the failed, stuck and quarantined counts; the deepest target's (key, count)
    row or None; the paused types' (type, paused_at, reason) rows, each listed with its backlog
    (none too)."""
    stopped = [PausedType(name, utc(at), reason) for name, at, reason in paused]
    backlog: dict[str, dict[str, Any]] = {}
    oldest = None
    for job_type, status, n, ready_at, enqueued, most, scheduled, retrying in per_status:
        backlog.setdefault(job_type, {})[status] = n
        if status == JobStatus.PENDING.value:
            backlog[job_type].update(ready=utc(ready_at), largest=most, scheduled=scheduled, retrying=retrying)
            first = utc(enqueued)
            oldest = first if oldest is None or (first is not None and first < oldest) else oldest
    names = {p.type for p in stopped}
    for name in names:
        backlog.setdefault(name, {})
    by_type = [
        TypeBacklog(
            k,
            v.get("pending", 0),
            v.get("claimed", 0),
            v.get("ready"),
            v.get("largest"),
            k in names,
            v.get("scheduled", 0),
            v.get("retrying", 0),
        )
        for k, v in sorted(backlog.items())
    ]
    target = None if deepest is None else TargetBacklog(deepest[0], deepest[1])
    return Stats(now, lock_timeout, by_type, failed, stuck, oldest, quarantined, target, stopped)
