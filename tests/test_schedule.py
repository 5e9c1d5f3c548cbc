"""Periodic jobs (tether.worker.schedule): each slot enqueued exactly once, across DST, with start, end,
limit and every catch-up mode, on both backends (a fake clock drives every step)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa

from clikit import run_split
from jobkit import Note, NoteType
from tether import Coordinator
from tether.clock import FakeClock
from tether.errors import InvalidPayload
from tether.jobtypes import CreateFile, default_registry
from tether.observe import schedules
from tether.worker import schedule
from tether.worker.cron import CATCH_UP_BOUND, ON_TIME, InvalidSchedule, first_slot, slot_after

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def open_two(make_coordinator: Callable[..., Coordinator]) -> Callable[[], tuple[Coordinator, Coordinator]]:
    """Two coordinators on one ledger: two workers (as on two machines) sharing the fake clock."""

    def two() -> tuple[Coordinator, Coordinator]:
        made = []
        for _ in range(2):
            registry = default_registry()
            registry.register(NoteType())
            made.append(make_coordinator(registry))
        return made[0], made[1]

    return two


def slots_of(c: Coordinator, name: str) -> Counter[str]:
    return Counter(str(j.idempotency_key) for j in schedules.runs(c.engine, name, limit=None))


def row(c: Coordinator, name: str) -> dict:
    return next(r for r in schedules.listing(c.engine) if r["name"] == name)


@pytest.mark.parametrize(
    ("day", "hours"),
    [(datetime(2026, 3, 29, tzinfo=BERLIN), 23), (datetime(2026, 10, 25, tzinfo=BERLIN), 25)],
    ids=["spring-forward", "fall-back"],
)
def test_every_quarter_hour_of_a_berlin_dst_day_is_enqueued_once(open_two, clock: FakeClock, day, hours) -> None:
    start = day.astimezone(UTC)
    following = (day + timedelta(days=1)).replace(tzinfo=BERLIN).astimezone(UTC)
    assert following - start == timedelta(hours=hours)
    clock.set(start)
    a, b = open_two()
    for c in (a, b):  # both deployments declare it; the ledger keeps one row
        c.schedule(
            "quarter", "*/15 * * * *", Note(name="q"), timezone="Europe/Berlin", end=following - timedelta(seconds=1)
        )
    workers = [a.worker(), b.worker()]
    while clock.now() < following + timedelta(minutes=30):
        for w in workers:
            w.run_once(clock.now())
        clock.advance(minutes=5)
    # Berlin's offsets are whole hours: its quarter-hours are UTC's, 4 per hour of that local day.
    expected = {schedule.key_for("quarter", start + timedelta(minutes=15 * i)) for i in range(hours * 4)}
    counts = slots_of(a, "quarter")
    assert set(counts) == expected
    assert set(counts.values()) == {1}
    r = row(a, "quarter")
    assert (r["runs"], r["missed"], r["next_run"]) == (hours * 4, 0, None)


def test_start_end_and_limit_bound_the_slots(open_two, clock: FakeClock) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    clock.set(base)
    a, _ = open_two()
    a.schedule("window", "*/10 * * * *", Note(name="w"), start=base + timedelta(hours=1), end=base + timedelta(hours=2))
    a.schedule("limited", "*/10 * * * *", Note(name="l"), start=base + timedelta(hours=1), limit=3)
    while clock.now() < base + timedelta(hours=3):
        a.scheduler.tick(clock.now())
        clock.advance(minutes=1)
    window = [schedule.key_for("window", base + timedelta(hours=1, minutes=10 * i)) for i in range(7)]
    assert sorted(slots_of(a, "window")) == window  # 01:00 to 02:00 inclusive
    limited = [schedule.key_for("limited", base + timedelta(hours=1, minutes=10 * i)) for i in range(3)]
    assert sorted(slots_of(a, "limited")) == limited
    assert row(a, "limited")["next_run"] is None and row(a, "window")["next_run"] is None


@pytest.mark.parametrize(
    ("catch_up", "enqueued", "missed"),
    [
        ("latest", ["03:00"], 11),
        ("all", [f"{h:02d}:{m:02d}" for h in range(3) for m in (0, 15, 30, 45)][1:] + ["03:00"], 0),
        ("none", [], 12),
    ],
)
def test_catch_up_after_a_three_hour_outage(open_two, clock: FakeClock, catch_up, enqueued, missed) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    clock.set(base)
    a, b = open_two()
    a.schedule("q", "*/15 * * * *", Note(name="q"), catch_up=catch_up)
    a.scheduler.tick(clock.now())  # 00:00 runs, then every worker is down until 03:07
    clock.set(base + timedelta(hours=3, minutes=7))
    b.schedule("q", "*/15 * * * *", Note(name="q"), catch_up=catch_up)  # a restarted deployment
    b.scheduler.tick(clock.now())
    keys = {schedule.key_for("q", base + timedelta(hours=int(t[:2]), minutes=int(t[3:]))) for t in enqueued}
    assert set(slots_of(a, "q")) == keys | {schedule.key_for("q", base)}
    r = row(a, "q")
    assert (r["catch_up"], r["missed"], r["next_run"]) == (catch_up, missed, base + timedelta(hours=3, minutes=15))


def test_catch_up_all_is_bounded(open_two, clock: FakeClock) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    clock.set(base)
    a, _ = open_two()
    a.schedule("s", "* * * * * *", Note(name="s"), catch_up="all")
    clock.advance(hours=1)
    a.scheduler.tick(clock.now())
    r = row(a, "s")
    on_time = int(ON_TIME.total_seconds()) + 1
    assert r["runs"] == CATCH_UP_BOUND + on_time
    assert r["missed"] == 3601 - r["runs"]


def test_a_slot_read_by_two_workers_is_enqueued_by_one(open_two, clock: FakeClock) -> None:
    a, b = open_two()
    a.schedule("q", "*/15 * * * *", Note(name="q"))
    b.schedule("q", "*/15 * * * *", Note(name="q"))
    seen = row(a, "q")["next_run"]
    clock.set(seen + timedelta(seconds=5))
    first = a.scheduler.fire(a.scheduler.specs["q"], seen, 0, clock.now())
    second = b.scheduler.fire(b.scheduler.specs["q"], seen, 0, clock.now())  # it read the same row
    assert len(first) == 1 and second == []
    a.run_until_idle()  # the first job finished: its key no longer blocks a duplicate insert
    assert b.scheduler.fire(b.scheduler.specs["q"], seen, 0, clock.now()) == []
    assert list(slots_of(a, "q").values()) == [1]


def test_pause_and_resume(open_two, clock: FakeClock) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    clock.set(base)
    a, _ = open_two()
    a.schedule("q", "*/15 * * * *", Note(name="q"))
    schedules.set_paused(a.engine, "q", True, clock.now())
    clock.advance(hours=1)
    a.scheduler.tick(clock.now())
    assert slots_of(a, "q") == Counter()
    resumed = schedules.set_paused(a.engine, "q", False, base + timedelta(hours=1, minutes=1))
    assert resumed["next_run"] == base + timedelta(hours=1, minutes=15)  # slots while paused are skipped
    with pytest.raises(schedules.UnknownSchedule, match="no schedule named 'nope'; known: q"):
        schedules.set_paused(a.engine, "nope", True, clock.now())


def test_a_changed_cron_reschedules_from_now(open_two, clock: FakeClock) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    clock.set(base + timedelta(minutes=1))
    a, b = open_two()
    a.schedule("q", "0 * * * *", Note(name="q"))
    assert row(a, "q")["next_run"] == base + timedelta(hours=1)
    b.schedule("q", "*/5 * * * *", Note(name="q"))
    assert (row(a, "q")["cron"], row(a, "q")["next_run"]) == ("*/5 * * * *", base + timedelta(minutes=5))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bad name!", "* * * * *"), "schedule name 'bad name!'"),
        (("q", "61 * * * *"), "bad cron expression '61 \\* \\* \\* \\*'"),
        (("q", "* * * * *", {"timezone": "Mars/Olympus"}), "unknown timezone 'Mars/Olympus'"),
        (("q", "* * * * *", {"catch_up": "some"}), "catch_up must be one of latest, all, none"),
        (("q", "* * * * *", {"limit": 0}), "limit must be a positive number"),
        (("q", "* * * * *", {"start": datetime(2026, 1, 1)}), "start must be a timezone-aware datetime"),
    ],
)
def test_bad_schedules_are_refused_and_nothing_is_recorded(coordinator: Coordinator, args, message) -> None:
    name, cron, *rest = args
    with pytest.raises(InvalidSchedule, match=message):
        coordinator.schedule(name, cron, Note(name="q"), **(rest[0] if rest else {}))
    assert schedules.listing(coordinator.engine) == []


def test_a_bad_payload_is_refused_when_declared(coordinator: Coordinator) -> None:
    with pytest.raises(InvalidPayload):
        coordinator.schedule("q", "* * * * *", CreateFile(path="../escape.json", content={}))
    assert schedules.listing(coordinator.engine) == []


def test_the_due_check_reads_the_due_index(coordinator: Coordinator) -> None:
    with coordinator.engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            explain = sa.text("EXPLAIN QUERY PLAN " + str(schedule.DUE))
            plan = " ".join(r[-1] for r in conn.execute(explain, {"now": "2026-01-01 00:00:00.000000"}))
            assert "USING INDEX ix_tether_schedules_due" in plan, plan
            assert "TEMP B-TREE" not in plan, plan
        else:
            conn.exec_driver_sql("SET enable_seqscan = off")  # an empty table: ask which plan it can use
            plan = " ".join(
                r[0] for r in conn.execute(sa.text("EXPLAIN " + str(schedule.DUE)), {"now": datetime.now(UTC)})
            )
            assert "ix_tether_schedules_due" in plan, plan


def run_cli(capsys, monkeypatch, db_url: str, *args: str) -> tuple[int, str, str]:
    return run_split(monkeypatch, capsys, "--db", db_url, *args)


def test_operators_list_pause_resume_and_see_a_schedules_runs(
    open_two, clock: FakeClock, db_url: str, capsys, monkeypatch
) -> None:
    import json

    base = datetime(2026, 1, 1, tzinfo=UTC)
    clock.set(base)
    a, _ = open_two()
    a.schedule("sync", "*/15 * * * *", Note(name="s"), timezone="Europe/Berlin")
    a.worker().run_once(clock.now())
    code, out, _ = run_cli(capsys, monkeypatch, db_url, "schedules", "--json")
    listed = json.loads(out)["schedules"]
    assert code == 0 and [(s["name"], s["cron"], s["timezone"], s["paused"]) for s in listed] == [
        ("sync", "*/15 * * * *", "Europe/Berlin", False)
    ]
    assert (listed[0]["last_run"], listed[0]["last_status"]) == (base.isoformat(), "completed")
    assert listed[0]["next_run"] == (base + timedelta(minutes=15)).isoformat()
    code, out, _ = run_cli(capsys, monkeypatch, db_url, "schedules")
    slot = (base + timedelta(minutes=15)).strftime("%Y-%m-%d %H:%M:%S")
    assert code == 0 and "sync" in out and "completed" in out and slot in out
    assert run_cli(capsys, monkeypatch, db_url, "schedules", "pause", "sync")[0] == 0
    # Paused, it has no next run: the slot it stopped at (soon past) is not shown as one.
    code, out, _ = run_cli(capsys, monkeypatch, db_url, "schedules")
    assert code == 0 and slot not in out and re.search(r"sync .* paused .* yes", out), out
    assert json.loads(run_cli(capsys, monkeypatch, db_url, "schedules", "--json")[1])["schedules"][0]["paused"] is True
    assert run_cli(capsys, monkeypatch, db_url, "schedules", "resume", "sync")[0] == 0
    code, _, err = run_cli(capsys, monkeypatch, db_url, "schedules", "pause", "nope")
    assert code == 1 and "no schedule named 'nope'" in err
    a.enqueue(Note(name="other"))
    code, out, _ = run_cli(capsys, monkeypatch, db_url, "jobs", "--schedule", "sync", "--json")
    assert [j["idempotency_key"] for j in json.loads(out)["jobs"]] == [schedule.key_for("sync", base)]


def test_a_named_hour_follows_the_timezone_through_the_dst_gap_and_repeat() -> None:
    # 02:30 does not exist in Berlin on 29 March: it fires once, at 03:00 CEST (01:00 UTC);
    # on 25 October 02:30 happens twice: it fires once, at the first (00:30 UTC).
    spring = first_slot("30 2 * * *", "Europe/Berlin", datetime(2026, 3, 28, 12, tzinfo=UTC))
    after_spring = slot_after("30 2 * * *", "Europe/Berlin", spring)  # type: ignore[arg-type]
    assert (spring, after_spring) == (datetime(2026, 3, 29, 1, tzinfo=UTC), datetime(2026, 3, 30, 0, 30, tzinfo=UTC))
    fall = first_slot("30 2 * * *", "Europe/Berlin", datetime(2026, 10, 24, 12, tzinfo=UTC))
    after_fall = slot_after("30 2 * * *", "Europe/Berlin", fall)  # type: ignore[arg-type]
    assert (fall, after_fall) == (datetime(2026, 10, 25, 0, 30, tzinfo=UTC), datetime(2026, 10, 26, 1, 30, tzinfo=UTC))


def walk(cron: str, timezone: str, start: datetime, stop: datetime) -> list[datetime]:
    """The slots from ``start`` (inclusive) to ``stop`` (exclusive), each the slot after the last."""
    slots: list[datetime] = []
    slot = first_slot(cron, timezone, start)
    while slot is not None and slot < stop:
        slots.append(slot)
        slot = slot_after(cron, timezone, slot)
    return slots


def utc(day: datetime, *times: str) -> list[datetime]:
    """``HH:MM`` UTC times counted from ``day`` (UTC midnight); an hour past 23 is the next day."""
    return [day + timedelta(hours=int(t[:2]), minutes=int(t[3:])) for t in times]


SPRING, FALL = datetime(2026, 3, 29, tzinfo=UTC), datetime(2026, 10, 25, tzinfo=UTC)
# Each local day in UTC: Berlin's 29 March (23 h) and 25 October (25 h); Lord Howe's 4 October
# (02:00 +10:30 -> 02:30 +11) and 5 April (02:00 +11 -> 01:30 +10:30): half-hour changes.
DAYS = {
    "berlin-spring": ("Europe/Berlin", SPRING - timedelta(hours=1), SPRING + timedelta(hours=22)),
    "berlin-fall": ("Europe/Berlin", FALL - timedelta(hours=2), FALL + timedelta(hours=23)),
    "howe-spring": (
        "Australia/Lord_Howe",
        datetime(2026, 10, 3, 13, 30, tzinfo=UTC),
        datetime(2026, 10, 4, 13, tzinfo=UTC),
    ),
    "howe-fall": (
        "Australia/Lord_Howe",
        datetime(2026, 4, 4, 13, tzinfo=UTC),
        datetime(2026, 4, 5, 13, 30, tzinfo=UTC),
    ),
}


@pytest.mark.parametrize(
    ("cron", "day", "expected"),
    [
        # Wall-clock times (minute and hour fields not starting with "*"): once a day each.
        ("30 2 * * *", "berlin-spring", utc(SPRING, "01:00")),  # 02:30 does not exist: 03:00 CEST
        ("30 2 * * *", "berlin-fall", utc(FALL, "00:30")),  # the first 02:30 (CEST) only
        ("30 1-3 * * *", "berlin-spring", utc(SPRING, "00:30", "01:00", "01:30")),
        ("30 1-3 * * *", "berlin-fall", utc(FALL - timedelta(days=1), "23:30", "24:30", "26:30")),
        ("0 2-3 * * *", "berlin-spring", utc(SPRING, "01:00")),  # 02:00 and 03:00 are one instant
        ("0,30 2 * * *", "berlin-fall", utc(FALL, "00:00", "00:30")),
        ("15 2 * * *", "howe-spring", utc(datetime(2026, 10, 3, tzinfo=UTC), "15:30")),  # 02:30 +11
        ("45 1 * * *", "howe-fall", utc(datetime(2026, 4, 4, tzinfo=UTC), "14:45")),  # 01:45 +11
        # A wildcard minute or hour: matched against each instant's local time.
        ("*/15 * * * *", "berlin-spring", 92),
        ("*/15 * * * *", "berlin-fall", 100),
        ("* 2 * * *", "berlin-spring", 0),  # no 02:xx that day
        ("* 2 * * *", "berlin-fall", 120),  # both 02:xx hours
        ("30 * * * *", "berlin-fall", 25),
        ("0 */2 * * *", "berlin-fall", 13),  # 00, 02 CEST, 02 CET, 04, ... 22
    ],
)
def test_five_and_six_field_expressions_follow_the_documented_dst_rules(cron, day, expected) -> None:
    timezone, start, stop = DAYS[day]
    for expression in (cron, "0 " + cron):  # seconds first: the same times, the same rules
        slots = walk(expression, timezone, start, stop)
        assert (len(slots) if isinstance(expected, int) else slots) == expected, expression


@pytest.mark.parametrize("cron", ["30 2 * * *", "45 2 * * 0", "30 1-3 * * *", "0 30 2 * * *", "15 20,40 2 * * *"])
def test_the_slot_after_an_instant_in_the_repeated_hour_is_the_next_one_after_it(cron) -> None:
    slots = walk(cron, "Europe/Berlin", FALL - timedelta(days=1), FALL + timedelta(days=8))
    instant = FALL - timedelta(minutes=10)
    while instant < FALL + timedelta(hours=2, minutes=10):  # the repeated hour is 00:00-02:00 UTC
        assert slot_after(cron, "Europe/Berlin", instant) == min(s for s in slots if s > instant), instant
        instant += timedelta(minutes=5)


def test_a_schedule_resumed_or_declared_in_the_repeated_hour_runs_its_slot_once(open_two, clock: FakeClock) -> None:
    # 02:30 Berlin happens at 00:30 UTC (CEST) and 01:30 UTC (CET) on 25 October; it runs at the first.
    tomorrow = datetime(2026, 10, 26, 1, 30, tzinfo=UTC)
    clock.set(FALL - timedelta(hours=12))
    a, b = open_two()
    a.schedule("nightly", "30 2 * * *", Note(name="n"), timezone="Europe/Berlin")
    worker = a.worker()
    clock.set(FALL + timedelta(minutes=30, seconds=5))
    worker.run_once(clock.now())
    schedules.set_paused(a.engine, "nightly", True, FALL + timedelta(minutes=50))
    clock.set(FALL + timedelta(hours=1, minutes=10))  # 02:10 CET, in the second 02:00-03:00
    assert schedules.set_paused(a.engine, "nightly", False, clock.now())["next_run"] == tomorrow
    b.schedule("late", "30 2 * * *", Note(name="l"), timezone="Europe/Berlin")  # declared there
    assert row(b, "late")["next_run"] == tomorrow
    for w in (worker, b.worker()):
        w.run_once(clock.now())
    assert slots_of(a, "nightly") == Counter({schedule.key_for("nightly", FALL + timedelta(minutes=30)): 1})
    assert slots_of(a, "late") == Counter()


@pytest.mark.parametrize("day", [SPRING, FALL], ids=["spring-forward", "fall-back"])
def test_a_six_field_fixed_time_runs_once_on_a_dst_day(open_two, clock: FakeClock, day) -> None:
    clock.set(day - timedelta(hours=1))
    a, b = open_two()
    for c in (a, b):
        c.schedule("nightly", "0 30 2 * * *", Note(name="n"), timezone="Europe/Berlin")
    workers = [a.worker(), b.worker()]
    while clock.now() < day + timedelta(hours=3):
        for w in workers:
            w.run_once(clock.now())
        clock.advance(minutes=10)
    # Spring: 02:30 does not exist, it runs at 03:00 CEST; fall: at the first 02:30 (CEST).
    slot = day + timedelta(hours=1) if day == SPRING else day + timedelta(minutes=30)
    assert slots_of(a, "nightly") == Counter({schedule.key_for("nightly", slot): 1})


def test_a_finished_schedule_given_a_higher_limit_runs_again_paused_or_not(open_two, clock: FakeClock) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    clock.set(base)
    a, _ = open_two()
    for name in ("paused", "running"):
        a.schedule(name, "*/10 * * * *", Note(name=name), limit=1)
    a.worker().run_once(clock.now())
    assert [row(a, n)["next_run"] for n in ("paused", "running")] == [None, None]  # finished
    schedules.set_paused(a.engine, "paused", True, clock.now())
    clock.set(base + timedelta(minutes=3))
    for name in ("paused", "running"):
        a.schedule(name, "*/10 * * * *", Note(name=name), limit=5)  # a redeploy allows more runs
    following = base + timedelta(minutes=10)
    assert [row(a, n)["next_run"] for n in ("paused", "running")] == [following, following]
    assert schedules.set_paused(a.engine, "paused", False, clock.now())["next_run"] == following
    clock.set(following + timedelta(seconds=5))
    a.worker().run_once(clock.now())
    assert [sum(slots_of(a, n).values()) for n in ("paused", "running")] == [2, 2]


def test_resume_gives_a_paused_schedule_with_runs_left_its_next_slot(open_two, clock: FakeClock) -> None:
    # A paused row with no next slot although its limit allows more runs: what the previous version
    # left after a redeploy raised the limit of a paused, finished schedule.
    base = datetime(2026, 1, 1, tzinfo=UTC)
    clock.set(base)
    a, _ = open_two()
    a.schedule("s", "*/10 * * * *", Note(name="s"), limit=5)
    with a.engine.begin() as conn:
        conn.execute(sa.update(schedule.s).values(paused=True, next_slot=None, run_count=1))
    resumed = schedules.set_paused(a.engine, "s", False, base + timedelta(minutes=3))
    assert resumed["next_run"] == row(a, "s")["next_run"] == base + timedelta(minutes=10)
