"""The targets table: one row per target, its latest completed job, kept by triggers.

A reconcile check decides each target by its latest completed job (unless one is in flight).
Read from ``tether_jobs``, that costs a seek per target into an index as long as the whole
history, so a check slows as the history grows. ``tether_targets`` holds that job's id, type
and fingerprint per target, so a check reads one range of it whatever each target's history
holds (``reconcile/reads.py``).

Triggers on ``tether_jobs`` keep it, on every path that makes, unmakes or changes a completed
targeted job: a completion, an insert of a completed row, a completed job put back, failed or
deleted (a manual retry, a purge, SQL by hand), a content check's new fingerprint. Triggers
rather than the completer's own statements because those paths are many and some are not
tether's. Their statements are the ``TARGETS_*`` blocks of each dialect's catalogue. An update
wakes them when it sets ``completed_at`` (or the target, type or fingerprint), never ``status``
alone, so that a claim wakes none: every statement that moves a job into or out of a finished
state sets ``completed_at``, and SQL by hand that does must set it too (``statements/sqlite.sql``).
"""

from __future__ import annotations

import sqlalchemy as sa

from .catalogue import Statements
from .schema import jobs, metadata

TABLE = "tether_targets"

targets = sa.Table(
    TABLE,
    metadata,
    # A target's latest completed job (the highest id among its completed jobs): what a check
    # expects of the target. A target none of whose jobs completed has no row.
    sa.Column("key", jobs.c.ordering_key.type, primary_key=True),  # tether_jobs.ordering_key
    sa.Column("job_id", jobs.c.id.type, nullable=False),
    sa.Column("type", jobs.c.type.type, nullable=False),
    sa.Column("fingerprint", sa.Text),  # the job's, as tether_jobs.fingerprint (renewed with it)
    sqlite_with_rowid=False,  # the row lives in its key's b-tree: a page is one range of it
)

TRIGGERS = {
    "tether_targets_on_insert": "TARGETS_ON_INSERT",
    "tether_targets_on_update": "TARGETS_ON_UPDATE",
    "tether_targets_on_delete": "TARGETS_ON_DELETE",
}
"""The triggers on ``tether_jobs`` that keep the table, by name, with their catalogue entries."""

RETIRED_TRIGGERS = ("tether_targets_on_enter", "tether_targets_on_leave", "tether_targets_on_fingerprint")
"""The triggers of earlier versions, woken by every change of ``status`` (a claim's too), which
``tether_targets_on_update`` replaces; ``ensure`` drops them."""


def ensure(conn: sa.Connection, sql: Statements) -> None:
    """Drop the retired triggers a ledger holds, create the triggers it lacks (with the PostgreSQL
    function they call) and, when any was missing, fill the table afresh from ``tether_jobs``: a
    ledger from before the table, or one whose triggers were dropped and whose table may have
    fallen behind, or one kept by the retired triggers until now. Runs in
    ``ensure_schema``'s transaction; on PostgreSQL, creating a trigger locks ``tether_jobs``
    against writers until it commits, so no completion can fall between the fill and the
    triggers."""
    present = set(conn.exec_driver_sql(sql.TARGETS_TRIGGERS).scalars())
    if sql.TARGETS_FUNCTION:
        conn.exec_driver_sql(sql.TARGETS_FUNCTION)
    on_table = " ON tether_jobs" if conn.dialect.name == "postgresql" else ""
    for name in RETIRED_TRIGGERS:
        if name in present:
            conn.exec_driver_sql(f"DROP TRIGGER {name}{on_table}")
    missing = [name for name in TRIGGERS if name not in present]
    if not missing:
        return
    for name in missing:
        conn.exec_driver_sql(getattr(sql, TRIGGERS[name]))
    conn.exec_driver_sql(sql.TARGETS_CLEAR)
    conn.exec_driver_sql(sql.TARGETS_FILL)
