"""Conflicts: transactions the database ends to break a cycle of waits between transactions
(PostgreSQL: SQLSTATE 40P01, a deadlock; 40001, a serialization failure). Nothing such a
transaction did was recorded, and running it again normally succeeds. A transaction of tether's
own is run again whole (``Backend.transact``); an application's own transaction (``session=``)
is the application's to run again, so it gets ``TransactionConflict`` instead of a driver error.
SQLite has no such conflicts: one writer at a time, and a wait for the write lock is no error."""

from __future__ import annotations

import random
import time

from .. import events
from ..errors import TransactionConflict

STATES = frozenset({"40P01", "40001"})
ATTEMPTS = 5
"""Runs of one of tether's own transactions, the first included, before a conflict is raised."""
_PAUSE = 0.002
"""Seconds: the longest pause before the first run again, doubled for each later one. Jittered,
so that the transactions that conflicted do not meet again in step."""


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a driver error, or of the one a SQLAlchemy error wraps (psycopg's)."""
    return getattr(getattr(error, "orig", error), "sqlstate", None)


def is_conflict(error: BaseException) -> bool:
    return sqlstate(error) in STATES


def run_again(error: BaseException, attempt: int) -> bool:
    """After run ``attempt`` of a transaction of tether's own ended with ``error``: whether to run
    it again, having logged it (``db_conflict``) and paused."""
    if attempt >= ATTEMPTS or not is_conflict(error):
        return False
    pause = random.uniform(0, _PAUSE * 2 ** (attempt - 1))
    events.emit("db_conflict", sqlstate=sqlstate(error), attempt=attempt, retry_in=round(pause, 4))
    time.sleep(pause)
    return True


def _reason(error: BaseException) -> str:
    """The database's one-line reason (its detail names server processes, of no use to a caller)."""
    return str(getattr(error, "orig", error)).split("\n", 1)[0]


def in_session(error: BaseException) -> TransactionConflict:
    """What an enqueue inside an application's own transaction raises for a conflict."""
    return TransactionConflict(
        f"the database ended your transaction to break a conflict with another one ({_reason(error)}, "
        f"SQLSTATE {sqlstate(error)}): nothing in it was recorded, the jobs enqueued in it included; "
        "roll the session back and run the whole transaction again"
    )


def unresolved(error: BaseException) -> TransactionConflict:
    """What an enqueue in tether's own transaction raises when every run of it met a conflict."""
    return TransactionConflict(
        f"could not record the job(s): the database ended each of tether's {ATTEMPTS} runs of the "
        f"transaction to break a conflict with other transactions ({_reason(error)}, SQLSTATE "
        f"{sqlstate(error)}); nothing was enqueued: enqueue them again"
    )
