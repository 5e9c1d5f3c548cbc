"""The ledger's tables as SQLAlchemy Core: columns, constraints and indexes, defined once.

Every statement (the hot SQL, the operator's read queries, ``ensure_schema``) is built from these
``sa.Table`` objects; they load SQLAlchemy Core alone (no ORM, no SQLModel, no pydantic), so a
read command such as ``tether status`` starts without them. ``tether.ledger.orm`` maps SQLModel classes
onto these same tables, for an application that reads them through its own ``Session``.

The tables are prefixed (as River's ``river_job`` and Oban's ``oban_jobs`` are) because
applications share the database with tether for the outbox, and ``jobs`` is a name they may
already use.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from .attempts import STORED
from .status import JobStatus

TABLE = "tether_jobs"
STATUS_CHECK = "ck_tether_jobs_status"
RECONCILE_TABLE = "tether_reconcile_runs"
WORKERS_TABLE = "tether_workers"
ATTEMPTS_TABLE = "tether_attempts"


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


metadata = sa.MetaData()
"""tether's own metadata, so an application's ``metadata.create_all`` never touches these tables."""

# The status CHECK as comparisons joined by OR, not ``status IN (...)``: SQLite codes a CHECK's IN
# list of more than two values as a temporary table built afresh for every row an INSERT or UPDATE
# writes (each claimed and completed row); ensure_schema respells an older CHECK (statuscheck.py).
STATUS_CHECK_SQL = " OR ".join(f"status = '{s.value}'" for s in JobStatus)
_OUTCOMES = ", ".join(f"'{o.value}'" for o in STORED)
ACTIVE_SQL = "status IN ('pending', 'claimed')"
PENDING_SQL = "status = 'pending'"
CLAIMED_SQL = "status = 'claimed'"
# Jobs without a key cannot conflict; leaving them out keeps the unique index small.
ACTIVE_KEYED_SQL = f"{ACTIVE_SQL} AND idempotency_key IS NOT NULL"


def _text(name: str, *, nullable: bool = True) -> sa.Column[Any]:
    return sa.Column(name, sa.Text, nullable=nullable)


def _time(name: str, *, nullable: bool = True) -> sa.Column[Any]:
    return sa.Column(name, UTCDateTime, nullable=nullable)


jobs = sa.Table(
    TABLE,
    metadata,
    # One unit of intended work and where it stands.
    sa.Column("id", sa.String(26), primary_key=True),
    sa.Column("type", sa.String(64), nullable=False),
    _text("payload", nullable=False),
    sa.Column("status", sa.String(16), nullable=False, default=JobStatus.PENDING.value),
    sa.Column("priority", sa.Integer, nullable=False, default=0),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("max_attempts", sa.Integer, nullable=False, default=3),
    _text("last_error"),
    sa.Column("locked_by", sa.String(128)),
    _time("locked_at"),
    _time("created_at", nullable=False),
    _time("claimed_at"),
    _time("completed_at"),
    _time("run_at", nullable=False),
    sa.Column("idempotency_key", sa.String(512)),
    sa.Column("ordering_key", sa.String(1024)),
    sa.Column("parent_id", sa.String(26)),
    _text("result"),
    sa.Column("timeout", sa.Float),  # seconds an attempt may take; None: the job type's timeout, if any
    _text("progress"),  # JSON {done, total, note, at} from the handler
    # Set when a worker died while holding the job (see reclaim.py); while set, the job is
    # claimed alone, never in a batch. Added after the first release: ensure_schema adds it.
    sa.Column("quarantine", sa.String(256)),
    # The payload's stored JSON in bytes, written with it at enqueue: a claim caps a batch by it
    # and ``tether status`` reports the largest pending one without reading any payload. Added
    # after the first release: ensure_schema adds it and fills it for jobs that may run again.
    sa.Column("payload_bytes", sa.Integer),
    # True while an older job on the same target is active: the claim leaves the job out without
    # looking at it (statements/sqlite.sql, "the order per target"). Kept by enqueue and by the transitions that
    # end a job; derived from the other columns, never part of a JobRecord. Added after the first
    # release: ensure_schema adds it, with its default, and sets it for the jobs waiting then.
    sa.Column("blocked", sa.Boolean, nullable=False, default=False, server_default=sa.false()),
    # How many times the job snoozed (a handler's Snooze, a rate limit's hold): the attempt was given
    # back each time, so this is what stops a job that snoozes forever (WorkerConfig.max_snoozes).
    sa.Column("snoozes", sa.Integer, nullable=False, default=0, server_default=sa.text("0")),
    # What the caller attached to the job, shown beside it and never read by tether: a JSON object
    # (ledger/notes.py bounds it). Written with the job, only when given; never part of a JobRecord.
    _text("meta"),
    # The failed job this one retries with a corrected payload (``tether retry ID --payload``); the
    # failed job stays as it was, as evidence. Never part of a JobRecord.
    sa.Column("retry_of", sa.String(26)),
    # An operator's cancel of the running job, with its reason (NULL: none asked): its worker
    # reads it for the jobs it runs (CANCEL_REQUESTS) and ends the attempt ``cancelled``. Set
    # only while the job is claimed by the attempt the operator saw; never part of a JobRecord.
    # Added after the first release: ensure_schema adds it.
    _text("cancel_reason"),
    # A completed file job's fingerprint (jobtypes/datafiles/fingerprint.py), copied from its result
    # at completion and renewed by a content check that reads the file in sync (the result keeps the
    # first); NULL: none (racily clean, another type, from before). Never part of a JobRecord.
    _text("fingerprint"),
    # The W3C trace context (``traceparent``) current when the job was enqueued, which each attempt's
    # span links to (tether.tracing); None when no trace was being recorded. Added after the first release.
    sa.Column("traceparent", sa.String(64)),
    sa.CheckConstraint(STATUS_CHECK_SQL, name=STATUS_CHECK),
)

paused = sa.Table(
    "tether_paused",
    metadata,
    # A job type an operator paused: no worker claims its jobs until it is resumed (its running
    # jobs finish). Workers read the whole table at most every ``pausing.REFRESH`` seconds and
    # leave these types out of the claim's ``types``.
    sa.Column("job_type", sa.String(64), primary_key=True),
    _text("reason"),
    _time("paused_at", nullable=False),
)

meta = sa.Table(
    "tether_meta",
    metadata,
    # What a ledger knows about itself, one row per key: its id, the data root it was created
    # for, and the schema version of the tether that last opened it (see meta.py).
    sa.Column("key", sa.String(64), primary_key=True),
    _text("value", nullable=False),
)

schedules = sa.Table(
    "tether_schedules",
    metadata,
    # One periodic job's coordination state (worker/schedule.py): its spec, the last slot enqueued and
    # the next one due. The payload stays in the application's code; this row only makes each
    # slot's enqueue a durable fact, advanced in the transaction that inserts the slot's job.
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("cron", sa.String(256), nullable=False),
    sa.Column("timezone", sa.String(64), nullable=False, default="UTC"),
    sa.Column("job_type", sa.String(64), nullable=False),
    _time("start_at"),
    _time("end_at"),
    sa.Column("run_limit", sa.Integer),
    sa.Column("catch_up", sa.String(16), nullable=False, default="latest"),
    _time("last_slot"),
    sa.Column("last_job_id", sa.String(26)),
    _time("next_slot"),  # None: finished (end or limit)
    sa.Column("paused", sa.Boolean, nullable=False, default=False),
    sa.Column("run_count", sa.Integer, nullable=False, default=0),
    sa.Column("missed", sa.Integer, nullable=False, default=0),  # slots skipped by catch_up
    _time("updated_at", nullable=False),
)

reconcile_runs = sa.Table(
    RECONCILE_TABLE,
    metadata,
    # The verdict of one reconcile check (its summary, never its findings), so a scraper or a
    # page can tell when disk and ledger were last compared and whether they agreed. Only the
    # newest few are kept (``reconcile_runs.KEEP``).
    sa.Column("id", sa.String(26), primary_key=True),  # a ULID of checked_at: newest is highest
    _time("checked_at", nullable=False),
    _time("finished_at", nullable=False),
    sa.Column("mode", sa.String(16), nullable=False),  # content or exists
    sa.Column("exit_code", sa.Integer, nullable=False),  # 0 in sync, 1 could not check, 2 drift
    sa.Column("drift", sa.Integer, nullable=False),
    _text("counts", nullable=False),  # JSON {status: n}
)

workers = sa.Table(
    WORKERS_TABLE,
    metadata,
    # One worker process (ledger/workers.py): written when it starts, its beat_at renewed by the
    # heartbeat that renews its jobs' locks, stopped_at set when it stops. A row whose beat_at is
    # older than the lock timeout is a worker that died. Never read or written by a claim.
    sa.Column("id", sa.String(128), primary_key=True),  # the worker's id, as tether_jobs.locked_by
    sa.Column("host", sa.String(128), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("threads", sa.Integer, nullable=False),
    sa.Column("version", sa.String(64), nullable=False),
    _time("started_at", nullable=False),
    _time("beat_at", nullable=False),
    _time("stopped_at"),
)

attempts = sa.Table(
    ATTEMPTS_TABLE,
    metadata,
    # How one attempt of a job ended, written with the outcome by the transition that ends it
    # (ledger/attempts.py); the attempt that completes a job is told by the job row instead.
    # Purge deletes a job's attempts with it.
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(26), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),  # the job's attempt count while it ran
    _time("started_at", nullable=False),  # when the claim took the job
    _time("ended_at", nullable=False),
    sa.Column("worker", sa.String(128)),  # None for an operator's retry
    sa.Column("outcome", sa.String(16), nullable=False),
    _text("error"),  # the first line only
    sa.Column("traceparent", sa.String(64)),  # the attempt's span, which the next attempt's links to
    sa.CheckConstraint(f"outcome IN ({_OUTCOMES})", name="ck_tether_attempts_outcome"),
)
# A job's attempts in the order they were written (history; purge deletes by job).
sa.Index("ix_tether_attempts_job", attempts.c.job_id, attempts.c.id)

repairs = sa.Table(
    "tether_repairs",
    metadata,
    # A job enqueued by an applied repair plan (reconcile/repair.py): which completed job it runs
    # again and the finding it answers. Written in the transaction that inserts the job, so a
    # repair job and its link exist together; a target's history reads it.
    sa.Column("job_id", sa.String(26), primary_key=True),
    sa.Column("repair_of", sa.String(26)),  # None: a job made for the finding (a temp file's removal)
    sa.Column("ordering_key", sa.String(1024), nullable=False),
    sa.Column("finding", sa.String(32), nullable=False),  # the drift status it answers
    _time("applied_at", nullable=False),
)

drift_findings = sa.Table(
    "tether_drift_findings",
    metadata,
    # The findings of the newest reconcile runs (reconcile/findings.py), so ``tether drift`` and
    # the pages show the last run without reading the disk, and a target's first and last drift
    # can be told. Only the newest few runs' rows are kept: each run deletes the older ones.
    sa.Column("run_id", sa.String(26), nullable=False),  # tether_reconcile_runs.id
    sa.Column("target", sa.String(1024), nullable=False),  # as an operator names it (a file's path)
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("job_id", sa.String(26)),
    sa.Column("ignored_by", sa.String(512)),  # the ignore rule that matched; None: reported
    _text("finding", nullable=False),  # the finding's JSON (sizes, hashes, differing fields; never contents)
)


# Most jobs carry no idempotency key, ordering key or parent, and most rows are finished: every
# index below is partial to the rows its queries ask about, so a job without them is in one index
# besides its primary key at every step: pending, then claimed, then done (the drain and bulk
# enqueue figures in benchmarks/ISSUE7.md).

job_tags = sa.Table(
    "tether_job_tags",
    metadata,
    # A job's tags ("tenant:acme"), one row each. A table of its own rather than a delimited text
    # column: "the jobs tagged T" is then a range of this primary key joined to the jobs by theirs,
    # where a membership test on a text column (LIKE '%,T,%') reads every row; and a job without
    # tags, the common case, costs its enqueue nothing. Written with the job; purge removes them with it.
    sa.Column("tag", sa.String(64), primary_key=True),
    sa.Column("job_id", sa.String(26), primary_key=True),
)
sa.Index("ix_tether_job_tags_job", job_tags.c.job_id)

# Columns of tether_jobs that are never part of a JobRecord: derived (``blocked``), a worker's
# instruction (``cancel_reason``), a content check's own (``fingerprint``) or only shown.
NOT_RECORDED = ("blocked", "cancel_reason", "fingerprint", "meta", "retry_of")
# The columns of a JobRecord: every column but those, in table order.
RECORD_COLUMNS = tuple(name for name in jobs.c.keys() if name not in NOT_RECORDED)

# The claim walks this index in exactly its ORDER BY (priority DESC, created_at, id) after the
# equality on ``blocked``: no sort step, it holds only the waiting jobs however many finished ones
# the table keeps, and the jobs blocked behind an older one on their target sit apart, where the
# claim never reads them (a target's backlog costs the claim nothing).
sa.Index(
    "ix_tether_jobs_queue",
    jobs.c.blocked,
    jobs.c.priority.desc(),
    jobs.c.created_at,
    jobs.c.id,
    sqlite_where=sa.text(PENDING_SQL),
    postgresql_where=sa.text(PENDING_SQL),
)
# Two racing enqueues with one key cannot both insert; finished jobs do not block a new one.
sa.Index(
    "ux_tether_jobs_key_active",
    jobs.c.type,
    jobs.c.idempotency_key,
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
    jobs.c.ordering_key,
    jobs.c.id,
    sqlite_where=_active_targeted,
    postgresql_where=_active_targeted,
)
# The stale-lock sweep only looks at claimed rows.
_claimed = sa.text(CLAIMED_SQL)
sa.Index(
    "ix_tether_jobs_claimed_lock",
    jobs.c.locked_at,
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
    jobs.c.status,
    jobs.c.completed_at,
    sqlite_where=sa.text(FINISHED_SQL),
    postgresql_where=sa.text(FINISHED_SQL),
)
# The failed jobs by type (a scrape's): few next to the history, but each one's row read for its
# type is a seek into the table.
FAILED_SQL = "status = 'failed' AND completed_at IS NOT NULL"
_failed = sa.text(FAILED_SQL)
sa.Index("ix_tether_jobs_failed", jobs.c.type, sqlite_where=_failed, postgresql_where=_failed)
# A target's jobs in enqueue order, its latest last: the order per target (NEWER_ON_TARGET), the targets
# jobs named, the triggers' refill (ledger/targets.py). No column a claim or an outcome sets is in it
# (not ``status``): a job's entry is written at enqueue only, never by a hot target's drain's commits.
_targeted = sa.text("ordering_key IS NOT NULL")
sa.Index(
    "ix_tether_jobs_on_target",
    jobs.c.ordering_key,
    jobs.c.id,
    jobs.c.type,
    sqlite_where=_targeted,
    postgresql_where=_targeted,
)
# "Which keys were used by more than one job?" (tether duplicates): only keyed jobs pay for it.
_keyed = sa.text("idempotency_key IS NOT NULL")
sa.Index("ix_tether_jobs_key", jobs.c.type, jobs.c.idempotency_key, sqlite_where=_keyed, postgresql_where=_keyed)
# "Was this failed job retried with a corrected payload, and as which job?" (``tether show``).
_retried = sa.text("retry_of IS NOT NULL")
sa.Index("ix_tether_jobs_retry_of", jobs.c.retry_of, jobs.c.id, sqlite_where=_retried, postgresql_where=_retried)
_child = sa.text("parent_id IS NOT NULL")
sa.Index("ix_tether_jobs_parent", jobs.c.parent_id, sqlite_where=_child, postgresql_where=_child)

# Jobs a dead worker left quarantined and not yet finished: ``tether status`` counts them, the
# sweep finds a crashed batch's other suspects. Empty while no worker dies.
QUARANTINED_SQL = f"quarantine IS NOT NULL AND {ACTIVE_SQL}"
_quarantined = sa.text(QUARANTINED_SQL)
sa.Index("ix_tether_jobs_quarantined", jobs.c.quarantine, sqlite_where=_quarantined, postgresql_where=_quarantined)


# The running jobs an operator asked to cancel, by the worker holding them: what each worker asks
# about twice a second while it runs jobs (CANCEL_REQUESTS), one probe of an index that is empty
# while nobody cancels. A claim or an outcome changes ``status``, so each checks this condition
# for its row; none adds an entry.
CANCEL_REQUESTED_SQL = f"cancel_reason IS NOT NULL AND {CLAIMED_SQL}"
sa.Index(
    "ix_tether_jobs_cancel_requested",
    jobs.c.locked_by,
    sqlite_where=sa.text(CANCEL_REQUESTED_SQL),
    postgresql_where=sa.text(CANCEL_REQUESTED_SQL),
)


# The worker's one query per poll: "which schedules are due?" reads only active schedules' next slots.
DUE_SQL = "NOT paused AND next_slot IS NOT NULL"
sa.Index(
    "ix_tether_schedules_due", schedules.c.next_slot, sqlite_where=sa.text(DUE_SQL), postgresql_where=sa.text(DUE_SQL)
)


# A run's findings, and a target's across the kept runs.
sa.Index("ix_tether_drift_findings_run", drift_findings.c.run_id, drift_findings.c.target)
sa.Index("ix_tether_drift_findings_target", drift_findings.c.target, drift_findings.c.run_id)


# Indexes of earlier versions, replaced by the partial ones above; ensure_schema drops them.
RETIRED_INDEXES = (
    "ix_tether_jobs_pending",  # (priority DESC, created_at, id), before ix_tether_jobs_queue put blocked first
    "ix_tether_jobs_finished",  # (status, completed_at) over every row, before ix_tether_jobs_done
    "ix_tether_jobs_claim",
    "ux_tether_jobs_active_key",
    "ix_tether_jobs_active_target",
    "ix_tether_jobs_target",
    "ix_tether_jobs_targeted",  # (ordering_key, id, status, type), before ix_tether_jobs_on_target left status out
)
