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

Slots are instants (UTC). The cron expression (five fields, or six with seconds first, as
``0 */15 * * * *``) is matched by cronsim in the schedule's timezone, and its minute and hour
fields choose how a DST change is met (cron's rule; the seconds field never changes it):

- If either starts with ``*`` (``*/15 * * * *``, ``0 */2 * * *``, ``* 2 * * *``), each instant's
  local time is matched: a local time that does not exist (spring forward) never fires, one that
  happens twice (fall back) fires twice. ``*/15 * * * *`` fires 92 times on Berlin's 23-hour day
  and 100 on its 25-hour day; ``* 2 * * *`` 0 and 120 times.
- Otherwise (``30 2 * * *``, ``30 1-3 * * *``, ``0 30 2 * * *``) it names wall-clock times, and each
  fires once that day: a time that does not exist fires at the first instant after the gap (once,
  however many named times fall in it: ``30 2 * * *`` in Berlin on 29 March 2026 at 03:00 CEST,
  ``0 2-3 * * *`` once, at 03:00), a time that happens twice on its first occurrence only
  (``30 1-3 * * *`` on 25 October: 01:30 CEST, 02:30 CEST, 03:30 CET).

A slot is due when its instant has passed by the ledger's clock (the queue's: on PostgreSQL the
database's, so a machine whose clock is off neither fires a slot early nor skips one, and the
guarded UPDATE enqueues it once whichever machine fires it); it is on time until ``ON_TIME``
after it, then missed (every worker was down, or the schedule was registered late). What happens
to missed slots is the schedule's ``catch_up``: ``"latest"`` enqueues the latest missed slot (if
no slot is on time), ``"all"`` each one, at most ``CATCH_UP_BOUND`` (the latest ones), ``"none"``
none. On-time slots are always enqueued. Skipped slots are counted in the row's ``missed``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import sqlalchemy as sa
from cronsim import CronSim, CronSimError
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from . import events
from .errors import ConfigError, TetherError
from .ledger.record import InsertResult, JobRecord
from .ledger.schema import DUE_SQL, schedules
from .observe.readonly import ledger_now, records, select_jobs
from .observe.readonly import t as jobs_table

if TYPE_CHECKING:
    from .jobtypes import Payload
    from .ledger.queue import Queue

CATCH_UP = ("latest", "all", "none")
CATCH_UP_BOUND = 100
"""At most this many missed slots are enqueued by ``catch_up="all"`` (the latest ones)."""
ON_TIME = timedelta(seconds=60)
"""A due slot is on time (always enqueued) until this long after it; later, it is missed."""
MIN_CHECK_GAP = 0.2
"""A worker's threads ask for due schedules at most this often (seconds) between them."""
KEY_PREFIX = "schedule:"
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")

s = schedules
_SPEC_COLUMNS = ("cron", "timezone", "job_type", "start_at", "end_at", "run_limit", "catch_up")


class InvalidSchedule(ConfigError):
    """A schedule's name, cron expression, timezone, dates, limit or catch-up choice is wrong."""


class UnknownSchedule(TetherError):
    """No schedule of that name is in the ledger."""


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


def slot_after(cron: str, timezone: str, after: datetime) -> datetime | None:
    """The first slot strictly after ``after`` (UTC in, UTC out); None if there is none within
    cronsim's horizon (50 years)."""
    zone = ZoneInfo(timezone)
    local = after.astimezone(zone)
    if _names_wall_clock_times(cron):
        # Matched on the local clock, without DST, then placed: a wall-clock time at or after
        # ``after``'s can still fall before it (its first occurrence, when ``after`` is in the
        # second), so the walk goes on to the first that does not.
        candidates = (_placed(naive, zone) for naive in CronSim(cron, local.replace(tzinfo=None)))
    else:
        candidates = (moment.astimezone(UTC) for moment in CronSim(cron, local))
    for slot in islice(candidates, _REPEATED_BOUND):
        if slot > after:
            return slot
    return None


_REPEATED_BOUND = 2 * 86_400
"""More candidates than a repeated local period holds (one a second, for a day: no zone repeats
more than two hours), so the walk past them ends."""


def _names_wall_clock_times(cron: str) -> bool:
    """Whether neither the minute nor the hour field starts with ``*``: cron's test for an
    expression that names times of day, which cronsim applies to five fields only."""
    minute, hour = cron.split()[-5:-3]
    return not minute.startswith("*") and not hour.startswith("*")


def _placed(naive: datetime, zone: ZoneInfo) -> datetime:
    """The instant (UTC) of a local wall-clock time: its first occurrence if it happens twice,
    the first instant after the gap (whole minute: gaps end on one) if it does not happen."""
    for minutes in range(_LONGEST_GAP_MINUTES):
        local = naive if minutes == 0 else naive.replace(second=0) + timedelta(minutes=minutes)
        moment = local.replace(tzinfo=zone).astimezone(UTC)  # fold=0: the first occurrence
        if moment.astimezone(zone).replace(tzinfo=None) == local:
            return moment
    raise InvalidSchedule(f"{naive:%Y-%m-%d %H:%M:%S} in {zone.key} is in a gap longer than two days")


_LONGEST_GAP_MINUTES = 2 * 24 * 60
"""Bounds the walk out of a DST gap (Samoa skipped a whole day in 2011; none was longer)."""


def _bounded(when: datetime | None, end: datetime | None, runs: int, limit: int | None) -> datetime | None:
    """``when``, unless it is past ``end`` or the run limit is reached (then None: finished)."""
    if when is None or (end is not None and when > end) or (limit is not None and runs >= limit):
        return None
    return when


def first_slot(
    cron: str,
    timezone: str,
    now: datetime,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    after: datetime | None = None,
    runs: int = 0,
    limit: int | None = None,
) -> datetime | None:
    """The first slot at or after ``now`` and ``start`` and strictly after ``after``."""
    origin = max(now, start or now) - timedelta(microseconds=1)
    if after is not None:
        origin = max(origin, after)
    return _bounded(slot_after(cron, timezone, origin), end, runs, limit)


def key_for(name: str, slot: datetime) -> str:
    """A scheduled job's idempotency key: its schedule and slot (``tether jobs --schedule``)."""
    return f"{KEY_PREFIX}{name}@{slot.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def slot_of(key: str | None) -> tuple[str, str] | None:
    """(schedule, slot) of a scheduled job's key; None for any other job."""
    if not key or not key.startswith(KEY_PREFIX) or "@" not in key:
        return None
    name, _, slot = key[len(KEY_PREFIX) :].rpartition("@")
    return name, slot


@dataclass
class Plan:
    """What one firing does: the slots to enqueue, how many are skipped, the next slot."""

    slots: list[datetime]
    missed: int
    next_slot: datetime | None


def plan(spec: Spec, seen: datetime, now: datetime, runs: int) -> Plan:
    """The slots due from ``seen`` (the row's next slot) up to ``now``, chosen by catch-up, and
    the slot after them. Walks every due slot once (an every-second schedule down for a day:
    86,400 steps of cronsim, about a second, once)."""
    on_time: list[datetime] = []
    latest_missed: deque[datetime] = deque(maxlen=CATCH_UP_BOUND)
    total_missed = 0
    slot: datetime | None = seen
    while slot is not None and slot <= now:
        if now - slot <= ON_TIME:
            on_time.append(slot)
        else:
            latest_missed.append(slot)
            total_missed += 1
        slot = _bounded(slot_after(spec.cron, spec.timezone, slot), spec.end, 0, None)
    if spec.catch_up == "all":
        chosen = [*latest_missed, *on_time]
    elif spec.catch_up == "latest" and not on_time and latest_missed:
        chosen = [latest_missed[-1]]
    else:
        chosen = on_time
    if spec.limit is not None:
        chosen = chosen[: max(0, spec.limit - runs)]
    missed = total_missed + len(on_time) - len(chosen)
    return Plan(chosen, missed, _bounded(slot, spec.end, runs + len(chosen), spec.limit))


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
                if all(getattr(row, c) == v for c, v in spec.row().items()):
                    pass
                else:
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
            self.queue.enqueuer.build([spec.payload], run_at=slot, key=key_for(spec.name, slot), now=now, **options)[0]
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


# -- operator actions and reads (tether schedules) ----------------------------------------------


def listing(engine: sa.Engine) -> list[dict[str, Any]]:
    """Every schedule with its last run's job status (one read)."""
    last_status = (
        sa.select(jobs_table.c.status).where(jobs_table.c.id == s.c.last_job_id).scalar_subquery().label("last_status")
    )
    with engine.connect() as conn:
        rows = conn.execute(sa.select(s, last_status).order_by(s.c.name)).mappings().all()
    return [
        {
            "name": r["name"],
            "cron": r["cron"],
            "timezone": r["timezone"],
            "type": r["job_type"],
            "next_run": r["next_slot"],
            "last_run": r["last_slot"],
            "last_job_id": r["last_job_id"],
            "last_status": r["last_status"],
            "paused": bool(r["paused"]),
            "catch_up": r["catch_up"],
            "runs": r["run_count"],
            "limit": r["run_limit"],
            "missed": r["missed"],
            "start": r["start_at"],
            "end": r["end_at"],
        }
        for r in rows
    ]


def set_paused(engine: sa.Engine, name: str, paused: bool, now: datetime | None = None) -> dict[str, Any]:
    """Pause or resume a schedule. A resumed schedule's next slot is the first from ``now``
    (default: the ledger's clock, ``ledger_now``): slots that fell while it was paused are skipped
    (counted in ``missed`` only when a worker sees them late, so not here)."""
    with engine.begin() as conn:
        now = now or ledger_now(conn)
        row = conn.execute(sa.select(s).where(s.c.name == name)).one_or_none()
        if row is None:
            known = conn.execute(sa.select(s.c.name).order_by(s.c.name)).scalars().all()
            raise UnknownSchedule(f"no schedule named {name!r}; known: {', '.join(known) or 'none'}")
        values: dict[str, Any] = {"paused": paused, "updated_at": now}
        if not paused and row.paused:  # a finished schedule gets None again from its bounds
            values["next_slot"] = first_slot(
                row.cron,
                row.timezone,
                now,
                start=row.start_at,
                end=row.end_at,
                after=row.last_slot,
                runs=row.run_count,
                limit=row.run_limit,
            )
        conn.execute(sa.update(s).where(s.c.name == name).values(**values))
    events.emit("schedule_paused" if paused else "schedule_resumed", schedule=name)
    return {"name": name, "paused": paused, "next_run": values.get("next_slot", row.next_slot)}


def runs(engine: sa.Engine, name: str, limit: int | None = 50) -> list[JobRecord]:
    """A schedule's jobs, newest slot first (they carry ``schedule:NAME@SLOT`` as their key)."""
    query = (
        select_jobs()
        .where(jobs_table.c.idempotency_key.startswith(f"{KEY_PREFIX}{name}@", autoescape=True))
        .order_by(jobs_table.c.idempotency_key.desc())
        .limit(limit)
    )
    with engine.connect() as conn:
        return records(conn, query)
