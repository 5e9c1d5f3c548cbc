"""Job ids within one millisecond: the last id plus one (monotonic ULIDs), never a repeat."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone

import pytest

from tether.ledger import ids
from tether.ledger.ids import new_id

NOW = datetime(2026, 3, 1, 12, 0, 0, 123_456, tzinfo=UTC)


def _value(job_id: str) -> int:
    from ulid import ULID

    return int(ULID.from_str(job_id))


@pytest.fixture(autouse=True)
def _fresh_ids(monkeypatch):
    monkeypatch.setattr(ids, "_last", (-1, ""))  # restored after: later tests keep real-time ids


def test_ids_of_one_millisecond_count_up_by_one_changing_only_their_tail():
    made = [new_id(NOW) for _ in range(3000)]  # crosses at least two carries out of the last 10 bits
    first = _value(made[0])
    assert [_value(m) for m in made] == list(range(first, first + 3000))
    assert made[0][:10] == ids.floor_id(NOW)[:10]  # the millisecond's own
    changed_tail_only = [a[:-2] == b[:-2] for a, b in zip(made, made[1:], strict=False)]
    assert changed_tail_only.count(False) in (2, 3)  # only where the last 10 bits wrap


def test_a_clock_that_goes_back_still_gets_increasing_ids():
    later = new_id(NOW)
    assert _value(new_id(NOW - timedelta(seconds=5))) == _value(later) + 1


def test_a_carry_out_of_the_random_bits_moves_the_millisecond_on_for_good(monkeypatch):
    class NoRandom:  # draws that make the next millisecond's first id its smallest
        def getrandbits(self, k: int) -> int:
            return 0

    monkeypatch.setattr(ids, "_random", NoRandom())
    ms = ids._ms(NOW)
    monkeypatch.setattr(ids, "_last", (ms, ids._encode((ms << 80) | (2**80 - 1))))  # the largest id of ms
    carried = new_id(NOW)
    assert _value(carried) == (ms + 1) << 80
    # The next millisecond has already begun: its ids follow the carried one, none repeats it.
    assert _value(new_id(NOW + timedelta(milliseconds=1))) == _value(carried) + 1


def test_a_forked_child_does_not_hand_out_the_parents_next_id():
    made = new_id(NOW)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id of the same millisecond, to the parent
        try:
            os.write(write, new_id(NOW).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        childs = pipe.read()
    os.waitpid(pid, 0)
    parents = new_id(NOW)
    assert _value(parents) == _value(made) + 1
    assert childs[:10] == parents[:10] and childs != parents


def test_an_id_holds_its_times_millisecond_whether_that_second_was_seen_before_or_not():
    # The millisecond comes from the last id's second where it can: on either side of every
    # boundary (second, day, year), and in other zones, it must be the time's own.
    from ulid import ULID

    start = datetime(2026, 12, 31, 23, 59, 58, 999_990, tzinfo=UTC)
    times = [start + timedelta(microseconds=7 * i) for i in range(300_000)]  # 2.1 s: three seconds
    half_hour_and_a_half_second = timezone(timedelta(minutes=30, microseconds=500_000))
    times += [t.astimezone(half_hour_and_a_half_second) for t in times[-3:]] + [start]  # and back
    for when in times:
        ids._last = (-1, "")  # else a time in an earlier millisecond gets the last id plus one
        assert ULID.from_str(new_id(when)).milliseconds == int(when.timestamp() * 1_000_000) // 1000
