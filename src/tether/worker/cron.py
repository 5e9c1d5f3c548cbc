"""When a cron schedule's slots fall, and which of the due ones a firing enqueues.

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

A due slot is on time until ``ON_TIME`` after it, then missed (every worker was down, or the
schedule was registered late). What happens to missed slots is the schedule's ``catch_up``:
``"latest"`` enqueues the latest missed slot (if no slot is on time), ``"all"`` each one, at most
``CATCH_UP_BOUND`` (the latest ones), ``"none"`` none. On-time slots are always enqueued. Skipped
slots are counted in the row's ``missed``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from cronsim import CronSim

from ..errors import ConfigError

if TYPE_CHECKING:
    from .schedule import Spec

CATCH_UP = ("latest", "all", "none")
CATCH_UP_BOUND = 100
"""At most this many missed slots are enqueued by ``catch_up="all"`` (the latest ones)."""
ON_TIME = timedelta(seconds=60)
"""A due slot is on time (always enqueued) until this long after it; later, it is missed."""


class InvalidSchedule(ConfigError):
    """A schedule's name, cron expression, timezone, dates, limit or catch-up choice is wrong."""


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


@dataclass
class Plan:
    """What one firing does: the slots to enqueue, how many are skipped, the next slot."""

    slots: list[datetime]
    missed: int
    next_slot: datetime | None


def plan(spec: Spec, seen: datetime, now: datetime, runs: int) -> Plan:
    """The slots due from ``seen`` (the row's next slot) up to ``now``, chosen by catch-up, and
    the slot after them. Walks every due slot once (an every-second schedule down for a day:
    86,400 steps of cronsim, once)."""
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
