"""PostgreSQL times on tether's connections: each distinct ``timestamptz`` of a cursor is
converted once (a claimed batch shares its claim time), and every value reads as psycopg reads it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from tether.ledger.engine import create_engine
from tether.ledger.pgtimes import _SEEN_MAX


@pytest.fixture
def engine(pg_database):
    engine = create_engine(pg_database)
    yield engine
    engine.dispose()


def test_a_time_repeated_down_a_cursor_is_one_datetime(engine):
    raw = engine.raw_connection()
    try:
        rows = raw.driver_connection.execute("SELECT now(), now() FROM generate_series(1, 3)").fetchall()
    finally:
        raw.close()
    [first, *others] = [value for row in rows for value in row]
    assert all(value is first for value in others)


def test_times_past_what_a_cursor_keeps_read_as_stored(engine):
    start = datetime(2020, 1, 1, tzinfo=UTC)
    with engine.connect() as conn:
        read = conn.execute(
            sa.text(
                "SELECT timestamptz '2020-01-01 00:00:00+00' + n * interval '0.25 second', NULL::timestamptz"
                " FROM generate_series(0, :last) AS n ORDER BY n"
            ),
            {"last": 2 * _SEEN_MAX},
        ).all()
    assert [when for when, _ in read] == [start + timedelta(seconds=0.25 * n) for n in range(2 * _SEEN_MAX + 1)]
    assert {none for _, none in read} == {None}
