"""The health verdict of a ledger read through SQLAlchemy (any backend): ``health`` is the
Python form of ``tether status``. The verdict itself (``Thresholds``, ``assess``) is in
``verdict``; on a SQLite file the command reads through ``lite`` instead.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .queries import Source, finished_statement, run_times_statement, stats
from .readonly import now_of, reading
from .verdict import Activity as Activity  # `X as X`: defined in verdict, this API too
from .verdict import Health as Health
from .verdict import HealthCheck as HealthCheck
from .verdict import Thresholds as Thresholds
from .verdict import Verdict as Verdict
from .verdict import activity_of
from .verdict import assess as assess


def activity(source: Source, window: float, *, now: datetime | None = None) -> Activity:
    """The window's finished jobs, from the same statements as ``tether recent`` and ``durations``."""
    until = now_of(source, now)
    since = until - timedelta(seconds=window)
    with reading(source) as conn:
        finished = conn.execute(finished_statement(since, until)).all()
        run_times = conn.execute(run_times_statement(conn.dialect.name, since)).all()
    return activity_of(window, finished, run_times)


def health(
    source: Source,
    thresholds: Thresholds | None = None,
    *,
    lock_timeout: float | None = None,
    now: datetime | None = None,
) -> Health:
    """``assess(stats(source, ...), thresholds, activity(...))`` at one ``now``: the Python form
    of ``tether status``."""
    th = thresholds or Thresholds()
    now = now_of(source, now)
    return assess(stats(source, lock_timeout=lock_timeout, now=now), th, activity(source, th.window, now=now))
