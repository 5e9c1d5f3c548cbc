"""Periodic jobs: a cron schedule enqueues each of its slots exactly once, however many workers
on however many machines poll it.

A schedule is declared in code (``coordinator.schedule(...)``, or a ``schedules(coordinator)``
function in a module loaded with ``--import``); its payload stays in that code. The ledger keeps
only its coordination state, one ``tether_schedules`` row: the spec, the last slot enqueued and
the next one due. A worker that finds a due slot advances ``next_slot`` with an UPDATE guarded
on the value it read, in the transaction that inserts the slot's job: of two workers (threads,
processes, machines) that read the same slot only one UPDATE matches, and the other inserts
nothing. So the enqueue of a slot is a durable fact of the ledger, no leader is elected, and a
worker killed mid-slot either committed both the job and the new ``next_slot`` or neither.

A slot is due when its instant has passed by the ledger's clock (the queue's: on PostgreSQL the
database's, so a machine whose clock is off neither fires a slot early nor skips one, and the
guarded UPDATE enqueues it once whichever machine fires it). When its slots fall, across DST
changes, and what happens to missed ones (``catch_up``): cron.py.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import sqlalchemy as sa
from cronsim import CronSim, CronSimError
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from .. import events
from ..ledger.record import InsertResult, JobRecord
from ..ledger.schema import DUE_SQL, schedules
from .cron import CATCH_UP, InvalidSchedule, first_slot, plan

if TYPE_CHECKING:
    from ..jobtypes import Payload
    from ..ledger.queue import Queue

MIN_CHECK_GAP = 0.2
"""A worker's threads ask for due schedules at most this often (seconds) between them."""
KEY_PREFIX = "schedule:"
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

s = schedules


@dataclass(frozen=True)
class Spec:
    """One schedule as declared in code."""

    name: str
    cron: str
    payload: Payload
    timezone: str = "UTC"
    start: datetime | None = None
    end: datetime | None = None
    limit: int | None = None
    catch_up: str = "latest"
    job_type: str = ""
    options: tuple[tuple[str, Any], ...] = ()  # enqueue options for every run (priority, max_attempts, timeout)

    def row(self) -> dict[str, Any]:
        return {
            "cron": self.cron,
            "timezone": self.timezone,
            "job_type": self.job_type,
            "start_at": self.start,
            "end_at": self.end,
            "run_limit": self.limit,
            "catch_up": self.catch_up,
        }


def validate(
    name: str,
    cron: str,
    timezone: str,
    start: datetime | None,
    end: datetime | None,
    limit: int | None,
    catch_up: str,
) -> ZoneInfo:
    """Raises InvalidSchedule naming what is wrong; returns the timezone."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidSchedule(f"schedule name {name!r}: use 1 to 128 letters, digits, '_', '.', ':' or '-'")
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise InvalidSchedule(
            f"schedule {name}: unknown timezone {timezone!r} (an IANA name, e.g. Europe/Berlin)"
        ) from e
    try:
        CronSim(cron, datetime(2026, 1, 1, tzinfo=zone))
    except CronSimError as e:
        raise InvalidSchedule(
            f"schedule {name}: bad cron expression {cron!r}: {e} (five fields, or six with seconds first)"
        ) from e
    for label, value in (("start", start), ("end", end)):
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
            raise InvalidSchedule(f"schedule {name}: {label} must be a timezone-aware datetime")
    if start is not None and end is not None and end < start:
        raise InvalidSchedule(f"schedule {name}: end {end.isoformat()} is before start {start.isoformat()}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidSchedule(f"schedule {name}: limit must be a positive number of runs, not {limit!r}")
    if catch_up not in CATCH_UP:
        raise InvalidSchedule(f"schedule {name}: catch_up must be one of {', '.join(CATCH_UP)}, not {catch_up!r}")
    return zone


def key_for(name: str, slot: datetime) -> str:
    """A scheduled job's idempotency key: its schedule and slot (``tether jobs --schedule``)."""
    return f"{KEY_PREFIX}{name}@{slot.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


class Scheduler:
    """The schedules one coordinator declared, and the worker's check for due slots."""

    def __init__(self, engine: sa.Engine, queue: Queue) -> None:
        self.engine = engine
        self.queue = queue
        self.specs: dict[str, Spec] = {}
        self._checked = 0.0
        self._lock = threading.Lock()

    def add(self, spec: Spec, now: datetime) -> None:
        """Record the schedule (first declaration), or its changed spec (a redeploy that changed
        the cron, timezone, dates, limit or catch-up: the next slot is recomputed from now, after
        the last one enqueued). An unchanged declaration leaves the row alone, so a restart keeps
        its next slot and catches up on what it missed."""
        first = first_slot(spec.cron, spec.timezone, now, start=spec.start, end=spec.end, limit=spec.limit)
        values = {"name": spec.name, **spec.row(), "next_slot": first, "updated_at": now}
        insert = pg_insert(s) if self.engine.dialect.name == "postgresql" else sqlite_insert(s)
        with self.engine.begin() as conn:
            # The insert comes first: on SQLite it takes the write lock before anything is read.
            if conn.execute(insert.values(**values).on_conflict_do_nothing()).rowcount == 1:
                events.emit("schedule_added", schedule=spec.name, cron=spec.cron, next_slot=first)
            else:
                row = conn.execute(sa.select(s).where(s.c.name == spec.name)).one()
                if not all(getattr(row, c) == v for c, v in spec.row().items()):
                    after = row.last_slot
                    # Paused or not, finished or not: a raised limit or a later end restarts it.
                    following = first_slot(
                        spec.cron,
                        spec.timezone,
                        now,
                        start=spec.start,
                        end=spec.end,
                        after=after,
                        runs=row.run_count,
                        limit=spec.limit,
                    )
                    conn.execute(
                        sa.update(s)
                        .where(s.c.name == spec.name)
                        .values(**spec.row(), next_slot=following, updated_at=now)
                    )
                    events.emit("schedule_changed", schedule=spec.name, cron=spec.cron, next_slot=following)
        self.specs[spec.name] = spec

    def tick(self, now: datetime | None = None) -> list[InsertResult]:
        """Enqueue every due slot of this process's schedules (the worker calls this each poll;
        one indexed query when nothing is due). Without ``now``, at most every MIN_CHECK_GAP."""
        if not self.specs:
            return []
        if now is None:
            with self._lock:
                mono = time.monotonic()
                if mono - self._checked < MIN_CHECK_GAP:
                    return []
                self._checked = mono
            now = self.queue.clock.now()
        with self.engine.connect() as conn:
            due = conn.execute(DUE, {"now": now}).all()
        results: list[InsertResult] = []
        for name, seen, runs in due:
            spec = self.specs.get(name)
            if spec is not None:  # a schedule another deployment declared: its workers fire it
                results.extend(self.fire(spec, seen, runs, now))
        return results

    def fire(self, spec: Spec, seen: datetime, runs: int, now: datetime) -> list[InsertResult]:
        """Enqueue ``spec``'s due slots and advance its row from ``seen``, in one transaction;
        nothing if another worker advanced it first."""
        step = plan(spec, seen, now, runs)
        options = dict(spec.options)
        jobs: list[JobRecord] = [
            self.queue.build(spec.payload, run_at=slot, key=key_for(spec.name, slot), now=now, **options)
            for slot in step.slots
        ]
        last = step.slots[-1] if step.slots else None
        advance = sa.update(s).where(s.c.name == spec.name, s.c.next_slot == seen, sa.text(DUE_SQL))
        values: dict[str, Any] = {
            "next_slot": step.next_slot,
            "run_count": s.c.run_count + len(jobs),
            "missed": s.c.missed + step.missed,
            "updated_at": now,
        }
        if jobs:
            values.update(last_slot=last, last_job_id=jobs[-1].id)
        results: list[InsertResult] = []
        with self.engine.begin() as conn:
            if conn.execute(advance.values(**values)).rowcount != 1:
                return []  # another worker enqueued this slot (or the schedule was paused)
            if jobs:
                with self.queue.backend.write(conn) as cur:
                    results = self.queue.enqueuer.insert_all(cur, jobs)
                    self.queue.wakeup.notify_in(cur)
        self.queue.enqueuer.committed(results)
        events.emit(
            "schedule_fired",
            schedule=spec.name,
            slots=len(jobs),
            last_slot=last,
            missed=step.missed or None,
            next_slot=step.next_slot,
        )
        return results


# The worker's one query per poll: due, unpaused schedules, read from ix_tether_schedules_due.
DUE = sa.text(
    f"SELECT name, next_slot, run_count FROM tether_schedules WHERE {DUE_SQL} AND next_slot <= :now ORDER BY next_slot"
).columns(sa.column("name", sa.String), sa.column("next_slot", s.c.next_slot.type), sa.column("run_count", sa.Integer))
DUE = DUE.bindparams(sa.bindparam("now", type_=s.c.next_slot.type))
