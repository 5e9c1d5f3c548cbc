"""The ``tether_jobs`` table: coordination state only, never application data.

The table is prefixed (as River's ``river_job`` and Oban's ``oban_jobs`` are) because applications
share the database with tether for the outbox, and ``jobs`` is a name they may already use.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

from ..status import JobStatus

TABLE = "tether_jobs"
RECONCILE_TABLE = "tether_reconcile_runs"


class UTCDateTime(sa.TypeDecorator[datetime]):
    """Timezone-aware UTC in Python on every backend (SQLite keeps a fixed-width text form,
    so ``<`` on the column is time order)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("tether stores timezone-aware UTC times only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class TetherModel(SQLModel, registry=registry()):
    """Own metadata, so an application's ``SQLModel.metadata.create_all`` never touches ours."""


_STATUSES = ", ".join(f"'{s.value}'" for s in JobStatus)
ACTIVE_SQL = "status IN ('pending', 'claimed')"
PENDING_SQL = "status = 'pending'"
CLAIMED_SQL = "status = 'claimed'"
# Jobs without a key cannot conflict; leaving them out keeps the unique index small.
ACTIVE_KEYED_SQL = f"{ACTIVE_SQL} AND idempotency_key IS NOT NULL"


class Job(TetherModel, table=True):
    """One unit of intended work and where it stands."""

    __tablename__ = TABLE
    __table_args__ = (sa.CheckConstraint(f"status IN ({_STATUSES})", name="ck_tether_jobs_status"),)

    id: str = Field(primary_key=True, max_length=26)
    type: str = Field(max_length=64)
    payload: str = Field(sa_type=sa.Text)
    status: str = Field(default=JobStatus.PENDING.value, max_length=16)
    priority: int = 0
    attempts: int = 0
    max_attempts: int = 3
    last_error: str | None = Field(default=None, sa_type=sa.Text)
    locked_by: str | None = Field(default=None, max_length=128)
    locked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(sa_type=UTCDateTime)
    claimed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    completed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    run_at: datetime = Field(sa_type=UTCDateTime)
    idempotency_key: str | None = Field(default=None, max_length=512)
    ordering_key: str | None = Field(default=None, max_length=1024)
    parent_id: str | None = Field(default=None, max_length=26)
    result: str | None = Field(default=None, sa_type=sa.Text)
    timeout: float | None = None  # seconds an attempt may take; None: the job type's timeout, if any
    progress: str | None = Field(default=None, sa_type=sa.Text)  # JSON {done, total, note, at} from the handler
    # Set when a worker died while holding the job (see reclaim.py); while set, the job is
    # claimed alone, never in a batch. Added after the first release: ensure_schema adds it.
    quarantine: str | None = Field(default=None, max_length=256)
    # True while an older job on the same target is active: the claim leaves the job out without
    # looking at it (sql.py, "Order per target"). Kept by enqueue and by the transitions that end
    # a job; derived from the other columns, never part of a JobRecord. Added after the first
    # release: ensure_schema adds it, with its default.
    blocked: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})


class Meta(TetherModel, table=True):
    """What a ledger knows about itself, one row per key: its id, the data root it was created
    for, and the schema version of the tether that last opened it (see meta.py)."""

    __tablename__ = "tether_meta"

    key: str = Field(primary_key=True, max_length=64)
    value: str = Field(sa_type=sa.Text)


class Schedule(TetherModel, table=True):
    """One periodic job's coordination state (schedule.py): its spec, the last slot enqueued and
    the next one due. The payload stays in the application's code; this row only makes each
    slot's enqueue a durable fact, advanced in the transaction that inserts the slot's job."""

    __tablename__ = "tether_schedules"

    name: str = Field(primary_key=True, max_length=128)
    cron: str = Field(max_length=256)
    timezone: str = Field(default="UTC", max_length=64)
    job_type: str = Field(max_length=64)
    start_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    end_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    run_limit: int | None = None
    catch_up: str = Field(default="latest", max_length=16)
    last_slot: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_job_id: str | None = Field(default=None, max_length=26)
    next_slot: datetime | None = Field(default=None, sa_type=UTCDateTime)  # None: finished (end or limit)
    paused: bool = False
    run_count: int = 0
    missed: int = 0  # slots skipped by catch_up (none, latest, or past the bound of all)
    updated_at: datetime = Field(sa_type=UTCDateTime)


_t = Job.__table__  # type: ignore[attr-defined]  # sqlmodel sets it; its types do not declare it

# Most jobs carry no idempotency key, ordering key or parent, and most rows are finished: every
# index below is partial to the rows its queries ask about, so a job without them is in one index
# besides its primary key at every step: pending, then claimed, then done (the drain and bulk
# enqueue figures in benchmarks/ISSUE7.md).

# The columns of a JobRecord: every column but ``blocked``, in table order.
RECORD_COLUMNS = tuple(name for name in _t.c.keys() if name != "blocked")

# The claim walks this index in exactly its ORDER BY (priority DESC, created_at, id) after the
# equality on ``blocked``: no sort step, it holds only the waiting jobs however many finished ones
# the table keeps, and the jobs blocked behind an older one on their target sit apart, where the
# claim never reads them (a target's backlog costs the claim nothing).
sa.Index(
    "ix_tether_jobs_queue",
    _t.c.blocked,
    _t.c.priority.desc(),
    _t.c.created_at,
    _t.c.id,
    sqlite_where=sa.text(PENDING_SQL),
    postgresql_where=sa.text(PENDING_SQL),
)
# Two racing enqueues with one key cannot both insert; finished jobs do not block a new one.
sa.Index(
    "ux_tether_jobs_key_active",
    _t.c.type,
    _t.c.idempotency_key,
    unique=True,
    sqlite_where=sa.text(ACTIVE_KEYED_SQL),
    postgresql_where=sa.text(ACTIVE_KEYED_SQL),
)
# "Is an older job on this target still active?" asked once per claim candidate with a target, at
# enqueue and when a job ends; and each target's backlog (``tether status``).
ACTIVE_TARGETED_SQL = f"{ACTIVE_SQL} AND ordering_key IS NOT NULL"
_active_targeted = sa.text(ACTIVE_TARGETED_SQL)
sa.Index(
    "ix_tether_jobs_target_active",
    _t.c.ordering_key,
    _t.c.id,
    sqlite_where=_active_targeted,
    postgresql_where=_active_targeted,
)
# The stale-lock sweep only looks at claimed rows.
_claimed = sa.text(CLAIMED_SQL)
sa.Index(
    "ix_tether_jobs_claimed_lock",
    _t.c.locked_at,
    sqlite_where=_claimed,
    postgresql_where=_claimed,
)
# Finished jobs by outcome and completion time: failures, "what ran lately", durations, purge.
# Only finished rows carry a completion time (completed, failed; a manual retry clears it), so
# a job enters this index once, when it finishes: waiting and running jobs are counted through
# the pending and claimed indexes instead. Queries name ``completed_at`` (a comparison, or
# IS NOT NULL) so both databases see that this index covers them.
FINISHED_SQL = "completed_at IS NOT NULL"
sa.Index(
    "ix_tether_jobs_done",
    _t.c.status,
    _t.c.completed_at,
    sqlite_where=sa.text(FINISHED_SQL),
    postgresql_where=sa.text(FINISHED_SQL),
)
# Reconcile streams every job with a target in (target, enqueue) order, so each path's latest job
# ends its group; status and type are in it so that stream never touches the table (payloads are
# read by id, and only for the probes that need them).
_targeted = sa.text("ordering_key IS NOT NULL")
sa.Index(
    "ix_tether_jobs_targeted",
    _t.c.ordering_key,
    _t.c.id,
    _t.c.status,
    _t.c.type,
    sqlite_where=_targeted,
    postgresql_where=_targeted,
)
# "Which keys were used by more than one job?" (tether duplicates): only keyed jobs pay for it.
_keyed = sa.text("idempotency_key IS NOT NULL")
sa.Index("ix_tether_jobs_key", _t.c.type, _t.c.idempotency_key, sqlite_where=_keyed, postgresql_where=_keyed)
sa.Index(
    "ix_tether_jobs_parent",
    _t.c.parent_id,
    sqlite_where=sa.text("parent_id IS NOT NULL"),
    postgresql_where=sa.text("parent_id IS NOT NULL"),
)

# Jobs a dead worker left quarantined and not yet finished: ``tether status`` counts them, the
# sweep finds a crashed batch's other suspects. Empty while no worker dies.
QUARANTINED_SQL = f"quarantine IS NOT NULL AND {ACTIVE_SQL}"
sa.Index(
    "ix_tether_jobs_quarantined",
    _t.c.quarantine,
    sqlite_where=sa.text(QUARANTINED_SQL),
    postgresql_where=sa.text(QUARANTINED_SQL),
)


class ReconcileRun(TetherModel, table=True):
    """The verdict of one reconcile check (its summary, never its findings), so a scraper or a
    page can tell when disk and ledger were last compared and whether they agreed. Only the
    newest few are kept (``reconcile_runs.KEEP``)."""

    __tablename__ = RECONCILE_TABLE

    id: str = Field(primary_key=True, max_length=26)  # a ULID of checked_at: newest is highest
    checked_at: datetime = Field(sa_type=UTCDateTime)
    finished_at: datetime = Field(sa_type=UTCDateTime)
    mode: str = Field(max_length=16)  # content or exists
    exit_code: int  # 0 in sync, 1 could not check, 2 drift
    drift: int
    counts: str = Field(sa_type=sa.Text)  # JSON {status: n}


# The worker's one query per poll: "which schedules are due?" reads only active schedules' next slots.
DUE_SQL = "NOT paused AND next_slot IS NOT NULL"
_s = Schedule.__table__  # type: ignore[attr-defined]
sa.Index("ix_tether_schedules_due", _s.c.next_slot, sqlite_where=sa.text(DUE_SQL), postgresql_where=sa.text(DUE_SQL))


# Indexes of earlier versions, replaced by the partial ones above; ensure_schema drops them.
RETIRED_INDEXES = (
    "ix_tether_jobs_pending",  # (priority DESC, created_at, id), before ix_tether_jobs_queue put blocked first
    "ix_tether_jobs_finished",  # (status, completed_at) over every row, before ix_tether_jobs_done
    "ix_tether_jobs_claim",
    "ux_tether_jobs_active_key",
    "ix_tether_jobs_active_target",
    "ix_tether_jobs_target",
)

metadata = TetherModel.metadata
