"""Every hot statement, named, in one place. Each runs unchanged on SQLite and PostgreSQL unless
a comment says otherwise (``:name`` placeholders; backend.py adapts them per driver). The SQLite
plans are checked in tests/test_query_plans.py."""

from __future__ import annotations

import re
from collections.abc import Iterable

from .schema import ACTIVE_KEYED_SQL, ACTIVE_TARGETED_SQL, QUARANTINED_SQL, RECORD_COLUMNS, TABLE

COLUMNS = RECORD_COLUMNS
_COLS = ", ".join(COLUMNS)
_ACTIVE = "status IN ('pending', 'claimed')"
_FENCE = "id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt"


def _sqlite_indexed(statement: str, indexes: dict[str, str]) -> str:
    """``statement`` with each alias's table read through the named index (``INDEXED BY``):
    SQLite does not weigh a partial index's smaller size, and should the index ever become
    unusable the statement fails to prepare instead of silently scanning. PostgreSQL has no such
    clause and plans for itself: ``unpinned`` takes it out (backend.py does, for every statement)."""
    for alias, index in indexes.items():
        statement = statement.replace(f"FROM {TABLE} AS {alias}\n", f"FROM {TABLE} AS {alias} INDEXED BY {index}\n")
    return statement


_INDEXED_BY = re.compile(r" INDEXED BY \w+")


def unpinned(statement: str) -> str:
    """``statement`` without SQLite's ``INDEXED BY`` clauses, for PostgreSQL."""
    return _INDEXED_BY.sub("", statement)


# -- the order per target: which jobs are blocked (DESIGN.md "Order per target") -------------------
# A job with a target is ``blocked`` while an older job on that target is active: the claim leaves
# it out through the claim index (ix_tether_jobs_queue puts blocked jobs apart) instead of reading
# each one to find that out, so a target's backlog costs the claim nothing. The flag is set when a
# job enters the active set (enqueue, an operator's retry) and cleared, for the oldest active job
# left on a target, when a job on it ends (UNBLOCK_NEXT). The claim still asks the rule itself
# (_ready): a flag missing (a ledger from before it, two racing enqueues) costs speed, never order.
#
# The active jobs on one target, in id order, are a range of ix_tether_jobs_target_active; every
# statement here asks for them as a range on ordering_key (``>= k``, or a row value), never as
# ``ordering_key = k``: with the key fixed by an equality, PostgreSQL may walk any index in id
# order instead (the primary key) and, on statistics that lag a drain (they still call the
# target's jobs active), read every finished job older than the one it looks for; asked as
# NOT EXISTS, it read the whole table per claim (benchmarks/README.md, hot_target.py).
def _on_target(alias: str, key: str) -> str:
    """``alias`` is an active job on target ``key`` or after it (ordering_key order)."""
    return f"{alias}.ordering_key >= {key} AND {alias}.ordering_key IS NOT NULL AND {alias}.{_ACTIVE}"


# PostgreSQL: the older job found is share-locked (the newest one: not the target's head, which a
# claim may be taking), so the transaction that ends it waits for this one to commit and then
# sees the job it blocks. A job that another transaction is changing at this moment (ending,
# claiming, unblocking or renewing it) is passed over (SKIP LOCKED), never waited for, so an
# insert never waits here and cannot be one side of a deadlock with those transactions. Waiting,
# it was: an insert of many jobs took these locks target after target in its rows' order while a
# group commit changed jobs, and unblocked the next ones, of several targets in another order.
# Passing over keeps the order exactly: the next older active job is asked instead (locked, it
# ends only after this transaction commits, and its ending sees the new job); with none left, the
# new job is not blocked, and the claim, which asks the rule itself (_ready), holds it back while
# the job passed over is still active. A flag missing costs the claim a probe, never order.
def _blocked(job_id: str, key: str, dialect: str) -> str:
    """Whether an older job than ``job_id`` on target ``key`` (SQL expressions) is active."""
    lock = ""
    if dialect == "postgresql":
        lock = "\n      ORDER BY b.ordering_key DESC, b.id DESC LIMIT 1 FOR SHARE SKIP LOCKED"
        # A parameter also bound to a column is typed by it; compared, it would be text.
        job_id, key = (f"CAST({e} AS varchar)" if e.startswith(":") else e for e in (job_id, key))
    return f"""EXISTS (SELECT 1 FROM {TABLE} AS b
      WHERE {_on_target("b", key)} AND (b.ordering_key, b.id) < ({key}, {job_id}){lock})"""


_ON_TARGET = {"b": "ix_tether_jobs_target_active"}

# Jobs without an idempotency key cannot conflict: inserted in one executemany, no RETURNING
# (the caller already knows every value).
INSERT_UNKEYED = f"""
INSERT INTO {TABLE} (id, type, payload, status, priority, attempts, max_attempts,
                     created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes)
VALUES (:id, :type, :payload, 'pending', :priority, 0, :max_attempts,
        :created_at, :run_at, :idempotency_key, :ordering_key, :parent_id, :timeout, :payload_bytes)
"""
# SQLite: INSERT_UNKEYED with positional parameters, for the single enqueue (a job without a
# target or key): binding fourteen values by name looks each name up in a dict, a noticeable part
# of the CPU of a durable enqueue (benchmarks/README.md, limits.py).
INSERT_UNKEYED_ROW = re.sub(
    r":\w+", "?", INSERT_UNKEYED.replace(":idempotency_key", "NULL").replace(":ordering_key", "NULL")
)
# A job with a target: INSERT_UNKEYED, blocked if an older job on the target is active.
_INSERT_ON_TARGET = f"""
INSERT INTO {TABLE} (id, type, payload, status, priority, attempts, max_attempts,
                     created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes,
                     blocked)
VALUES (:id, :type, :payload, 'pending', :priority, 0, :max_attempts,
        :created_at, :run_at, :idempotency_key, :ordering_key, :parent_id, :timeout, :payload_bytes,
        {{blocked}})
"""
# A keyed job: nothing is inserted while an active job of its type holds the key.
_INSERT = f"""{_INSERT_ON_TARGET.rstrip()}
ON CONFLICT (type, idempotency_key) WHERE {ACTIVE_KEYED_SQL} DO NOTHING
RETURNING {_COLS}
"""
INSERT_ON_TARGET = _sqlite_indexed(
    _INSERT_ON_TARGET.format(blocked=_blocked(":id", ":ordering_key", "sqlite")), _ON_TARGET
)
INSERT_ON_TARGET_POSTGRES = _INSERT_ON_TARGET.format(blocked=_blocked(":id", ":ordering_key", "postgresql"))
INSERT = _sqlite_indexed(_INSERT.format(blocked=_blocked(":id", ":ordering_key", "sqlite")), _ON_TARGET)
INSERT_POSTGRES = _INSERT.format(blocked=_blocked(":id", ":ordering_key", "postgresql"))

# Many unkeyed jobs of one type that share their options, in one statement: what varies travels
# as one JSON text: binding ten values per row through the driver cost twice SQLite's own insert.
# Jobs without a target go as an object {id: payload}, which the database walks without parsing
# each row again.
_INSERT_SELECT = """
INSERT INTO {table} (id, type, payload, status, priority, attempts, max_attempts,
                     created_at, run_at, idempotency_key, ordering_key, parent_id, timeout,
                     payload_bytes{blocked_column})
SELECT {id}, :type, {payload}, 'pending', :priority, 0, :max_attempts,
       :created_at, :run_at, NULL, {ordering_key}, :parent_id, :timeout, {payload_bytes}{blocked}
FROM {rows}
"""
# The two dialects differ only in how they read JSON: SQLite's json_each / json_extract against
# PostgreSQL's json_each_text / json_array_elements and ->>, and in how they count a text's
# bytes (SQLite's length() counts characters, of a blob bytes). Jobs with a target go as rows
# [id, payload, ordering_key, payload_bytes, behind]: ``behind`` is true when an older job of the
# same statement has the same target (the statement does not see its own rows), else the ledger
# is asked.
_PAYLOADS = {"id": "key", "payload": "value", "ordering_key": "NULL", "blocked_column": "", "blocked": ""}
_TARGETED = ("id", "payload", "ordering_key", "payload_bytes", "behind")
INSERT_PAYLOADS_SQLITE = _INSERT_SELECT.format(
    table=TABLE, rows="json_each(:rows)", payload_bytes="length(CAST(value AS BLOB))", **_PAYLOADS
)
INSERT_PAYLOADS_POSTGRES = _INSERT_SELECT.format(
    table=TABLE, rows="json_each_text(CAST(:rows AS json))", payload_bytes="octet_length(value)", **_PAYLOADS
)


def _insert_targeted(rows: str, field: dict[str, str], dialect: str) -> str:
    blocked = _blocked(field["id"], field["ordering_key"], dialect)
    return _INSERT_SELECT.format(
        table=TABLE,
        rows=rows,
        id=field["id"],
        payload=field["payload"],
        ordering_key=field["ordering_key"],
        payload_bytes=field["payload_bytes"],
        blocked_column=", blocked",
        blocked=f",\n       CASE WHEN {field['behind']} THEN TRUE ELSE {blocked} END",
    )


INSERT_TARGETED_SQLITE = _sqlite_indexed(
    _insert_targeted(
        "json_each(:rows)", {c: f"json_extract(value, '$[{i}]')" for i, c in enumerate(_TARGETED)}, "sqlite"
    ),
    _ON_TARGET,
)
INSERT_TARGETED_POSTGRES = _insert_targeted(
    "json_array_elements(CAST(:rows AS json)) AS r(value)",
    {
        **{c: f"value ->> {i}" for i, c in enumerate(_TARGETED)},
        # ->> reads text: PostgreSQL converts it only when asked
        "payload_bytes": "CAST(value ->> 3 AS integer)",
        "behind": "CAST(value ->> 4 AS boolean)",
    },
    "postgresql",
)

ACTIVE_BY_KEY = f"""
SELECT {_COLS} FROM {TABLE}
WHERE type = :type AND idempotency_key = :idempotency_key AND {_ACTIVE}
"""

GET = f"SELECT {_COLS} FROM {TABLE} WHERE id = :id"


# A job waits while an older job on the same target (ordering_key) is still active, so writes
# to one path land in enqueue order even when the older one is retried. Jobs known to wait are
# ``blocked`` and never read (above); for the rest the rule decides: the candidate, active itself,
# is the oldest active job on its target, the first entry of its target's range of
# ix_tether_jobs_target_active (the range form: above). The IS NULL test is not redundant:
# without it PostgreSQL, on statistics that lag a freshly filled queue, plans the probe as a join
# reading every active job once per candidate.
# A worker claims only the types it has registered ({types}: their names as SQL literals, filled
# in by ``claim_sql``): a job of a type it lacks waits for a worker that has it, instead of
# burning its attempts on UnknownJobType. Literals, not a bound list: the planner sees a constant.
def _ready(j: str, o: str) -> str:
    """The claim's condition on candidate ``j`` (``o``: the alias of its target probe)."""
    return f"""{j}.status = 'pending' AND {j}.blocked = FALSE AND {j}.run_at <= :now AND {j}.type IN ({{types}})
  AND ({j}.ordering_key IS NULL OR {j}.id = (
      SELECT {o}.id FROM {TABLE} AS {o}
      WHERE {_on_target(o, f"{j}.ordering_key")}
      ORDER BY {o}.ordering_key, {o}.id LIMIT 1))"""


_ORDER = "ORDER BY {j}.priority DESC, {j}.created_at, {j}.id"


# Claimed alone: a job a worker died holding (quarantined), so a job that kills its
# worker takes no batch-mate down with it; and a job on its last attempt, so that a crash while it
# runs is pinned on it at once: in a batch nobody knows which job was running, and a poison job
# with one attempt left would otherwise be charged only at its next crash. The first ready job in
# claim order decides: claimed alone, the claim takes it alone; otherwise plain jobs.
#
# Bytes: a batch holds at most :max_bytes of payload, or one job, so a worker's memory
# follows bytes, not how many large jobs are queued. The first ready job decides this too: every
# job of the batch holds at most ``fits`` bytes, the first job's or the batch's even share
# (:max_bytes / :limit) if that is more, and the batch takes as many as fit (at least one, at most
# :limit), in order. Jobs of ordinary size go together up to :limit; a batch led by a large job
# takes only jobs no larger; a job larger than a batch's ``fits`` is left for a later claim, which
# it leads. These are conditions on each row's payload_bytes (kept at enqueue): no payload is read
# to decide, and no window sums the candidates (one cost the claim of 100 small jobs 15% more,
# benchmarks/README.md). The two backends find that first job differently (below).
def _plain(j: str) -> str:
    return f"({j}.quarantine IS NULL AND {j}.attempts + 1 < {j}.max_attempts)"


# SQLite: one probe of the first ready job, built from the same _ready() as the candidates so the
# two cannot disagree; it reads one entry of the pending index (SQLite cannot sort the chosen
# candidates again without a temp B-tree, which the plan tests forbid). A materialised CTE, so the
# WHERE and the LIMIT read one evaluation of it: ``fits``, or -1 when that job is claimed alone
# (1 when there is none: nor is there a candidate).
_FITS = "(SELECT fits FROM first)"
_CLAIMABLE_SQLITE = f"""
WITH first(fits) AS MATERIALIZED (SELECT coalesce((
    SELECT CASE WHEN {_plain("h")} THEN max(coalesce(h.payload_bytes, 0), :max_bytes / max(:limit, 1), 1) ELSE -1 END
    FROM {TABLE} AS h
    WHERE {_ready("h", "ho")}
    {_ORDER.format(j="h")} LIMIT 1), 1))
SELECT j.id FROM {TABLE} AS j
WHERE {_ready("j", "o")}
  AND CASE WHEN {_FITS} < 0 THEN NOT {_plain("j")}
      ELSE {_plain("j")} AND coalesce(j.payload_bytes, 0) <= {_FITS} END
{_ORDER.format(j="j")}
LIMIT CASE WHEN {_FITS} < 0 THEN min(:limit, 1) ELSE min(:limit, max(1, :max_bytes / {_FITS})) END
"""

# A claim returns the payloads of up to INLINE_PAYLOAD bytes with its rows; the larger ones come
# back NULL and are read after it, one at a time (PAYLOAD). SQLite holds every RETURNING row until
# the statement ends, beside the row it rewrote: claiming one 8 MiB job grew a process by 66 MiB,
# by 33 MiB with the payload read after (benchmarks/README.md).
INLINE_PAYLOAD = 16 * 1024
PAYLOAD = f"SELECT payload FROM {TABLE} WHERE id = :id"


def _claimed_columns(t: str) -> str:
    inline = f"CASE WHEN coalesce({t}payload_bytes, 0) <= {INLINE_PAYLOAD} THEN {t}payload END"
    return ", ".join(inline if c == "payload" else t + c for c in COLUMNS)


_CLAIM = """
UPDATE {table} SET status = 'claimed', locked_by = :worker, locked_at = :now,
                   claimed_at = :now, attempts = attempts + 1
WHERE status = 'pending' AND id IN ({claimable})
RETURNING {cols}
"""
# SQLite: the unary + on the outer guard keeps the planner from walking the claim index over
# every pending row to re-check it; the chosen ids are then looked up by primary key, and the
# claim costs the same at 20,000 pending jobs as at 20 (PostgreSQL has no unary + on text).
# INDEXED BY pins both probes to their partial indexes, which SQLite would otherwise trade for
# a sort of the pending rows of a status index.
CLAIM_SQLITE = _sqlite_indexed(
    _CLAIM.format(table=TABLE, claimable=_CLAIMABLE_SQLITE, cols=_claimed_columns("")).replace(
        "WHERE status = 'pending' AND id IN", "WHERE +status = 'pending' AND id IN"
    ),
    {
        "j": "ix_tether_jobs_queue",
        "h": "ix_tether_jobs_queue",
        "o": "ix_tether_jobs_target_active",
        "ho": "ix_tether_jobs_target_active",
    },
)
# PostgreSQL: concurrent claimers skip rows another transaction is claiming instead of queueing
# behind its row locks (SQLite has one writer at a time and needs no such clause). The candidates
# sit in a CTE because PostgreSQL may re-run an ``IN (... LIMIT n)`` subquery per outer row,
# claiming more than n jobs; a locking CTE is evaluated exactly once. Claimed alone and bytes:
# the first of the (at most :limit) candidates it locked decides, sorted in memory; a probe like
# SQLite's would walk the pending jobs again, which on statistics that lag a freshly filled queue
# is a bitmap scan and sort of every pending job, twice (benchmarks/README.md). Candidates left
# out (claimed alone, larger than ``fits``, past what fits) stay pending; their row locks end
# with the transaction.
CLAIM_POSTGRES = f"""
WITH next AS (
    SELECT j.id, {_plain("j")} AS plain, coalesce(j.payload_bytes, 0) AS size, j.priority, j.created_at
    FROM {TABLE} AS j
    WHERE {_ready("j", "o")}
    {_ORDER.format(j="j")}
    LIMIT :limit FOR UPDATE OF j SKIP LOCKED),
first AS MATERIALIZED (
    SELECT n.id, n.plain, greatest(n.size, :max_bytes / greatest(:limit, 1), 1) AS fits
    FROM next AS n {_ORDER.format(j="n")} LIMIT 1),
taken AS (
    SELECT n.id FROM next AS n, first AS f
    WHERE n.id = f.id OR (f.plain AND n.plain AND n.size <= f.fits)
    {_ORDER.format(j="n")}
    LIMIT least(:limit, greatest(1, :max_bytes / (SELECT fits FROM first))))
UPDATE {TABLE} AS t SET status = 'claimed', locked_by = :worker, locked_at = :now,
                        claimed_at = :now, attempts = t.attempts + 1
FROM taken
WHERE t.id = taken.id
RETURNING {_claimed_columns("t.")}
"""

# Fenced transitions out of 'claimed': they apply only to the worker's own attempt.
COMPLETE = f"""
UPDATE {TABLE} SET status = 'completed', locked_by = NULL, locked_at = NULL,
                   completed_at = :now, result = :result
WHERE {_FENCE} RETURNING {_COLS}
"""
# COMPLETE for many of one worker's jobs in one statement, fenced row by row exactly as COMPLETE
# is; :rows is a JSON object {id: [attempt, completed_at, result]}, and the (id, attempts) returned
# # are the jobs that moved (the others lost their lease). One statement instead of one per job
# halves the cost of a completion. SQLite: the unary + keeps the planner from walking every claimed
# job's status entry once per row; it reads the JSON and looks each id up by primary key.
COMPLETE_MANY_SQLITE = f"""
UPDATE {TABLE} SET status = 'completed', locked_by = NULL, locked_at = NULL,
                   completed_at = json_extract(r.value, '$[1]'), result = json_extract(r.value, '$[2]')
FROM json_each(:rows) AS r
WHERE {TABLE}.id = r.key AND +{TABLE}.status = 'claimed' AND {TABLE}.locked_by = :worker
  AND {TABLE}.attempts = json_extract(r.value, '$[0]')
RETURNING {TABLE}.id, {TABLE}.attempts
"""
COMPLETE_MANY_POSTGRES = f"""
UPDATE {TABLE} AS t SET status = 'completed', locked_by = NULL, locked_at = NULL,
                        completed_at = CAST(r.value ->> 1 AS timestamptz), result = r.value ->> 2
FROM json_each(CAST(:rows AS json)) AS r
WHERE t.id = r.key AND t.status = 'claimed' AND t.locked_by = :worker
  AND t.attempts = CAST(r.value ->> 0 AS integer)
RETURNING t.id, t.attempts
"""
RETRY = f"""
UPDATE {TABLE} SET status = 'pending', locked_by = NULL, locked_at = NULL,
                   run_at = :run_at, last_error = :error
WHERE {_FENCE} RETURNING {_COLS}
"""
FAIL = f"""
UPDATE {TABLE} SET status = 'failed', locked_by = NULL, locked_at = NULL,
                   completed_at = :now, last_error = :error
WHERE {_FENCE} RETURNING {_COLS}
"""
# Cancelled at shutdown: the attempt is given back.
RELEASE = f"""
UPDATE {TABLE} SET status = 'pending', locked_by = NULL, locked_at = NULL,
                   attempts = attempts - 1
WHERE {_FENCE} RETURNING {_COLS}
"""
# A rate limit with a reset time: the attempt is given back and the job waits until the reset;
# DEFER_TYPE holds back the type's other pending jobs until then too (not a status change).
DEFER = f"""
UPDATE {TABLE} SET status = 'pending', locked_by = NULL, locked_at = NULL,
                   attempts = attempts - 1, run_at = :run_at, last_error = :error
WHERE {_FENCE} RETURNING {_COLS}
"""
DEFER_TYPE = f"UPDATE {TABLE} SET run_at = :run_at WHERE type = :type AND status = 'pending' AND run_at < :run_at"
HEARTBEAT = f"UPDATE {TABLE} SET locked_at = :now WHERE {_FENCE}"
# A running handler's progress (throttled by the context): only while this worker holds the job.
PROGRESS = f"UPDATE {TABLE} SET progress = :progress WHERE {_FENCE}"
HOLDS = f"SELECT id FROM {TABLE} WHERE {_FENCE}"
# After a group commit whose answer was lost (the connection died during COMMIT): where a job
# stands, and whether it is still held for the attempt decided on. The claim's time is part of
# the test: this worker may have claimed the job again since a lost commit released it.
STANDING = f"""
SELECT status, CASE WHEN {_FENCE} AND claimed_at = :claimed_at THEN 1 ELSE 0 END
FROM {TABLE} WHERE id = :id
"""

# A failed job retried after a newer job on its target ran would undo the newer one.
NEWER_ON_TARGET = f"""
SELECT id FROM {TABLE}
WHERE ordering_key = :ordering_key AND id > :id AND status IN ('pending', 'claimed', 'completed')
ORDER BY id LIMIT 1
"""

# Back in the active set: blocked if an older job on its target is active (a newer one cannot
# be: Superseded refuses the retry first).
_MANUAL_RETRY = f"""
UPDATE {TABLE} SET status = 'pending', attempts = 0, run_at = :now, completed_at = NULL,
                   locked_by = NULL, locked_at = NULL, quarantine = NULL,
                   blocked = {{blocked}}
WHERE id = :id AND status = 'failed' RETURNING {_COLS}
"""
MANUAL_RETRY = _sqlite_indexed(
    _MANUAL_RETRY.format(blocked=_blocked(f"{TABLE}.id", f"{TABLE}.ordering_key", "sqlite")), _ON_TARGET
)
MANUAL_RETRY_POSTGRES = _MANUAL_RETRY.format(blocked=_blocked(f"{TABLE}.id", f"{TABLE}.ordering_key", "postgresql"))

# A job on target :ordering_key left the active set (completed, failed): the oldest active job
# left on it may run now. Run after the job's own transition, in its transaction.
UNBLOCK_NEXT = _sqlite_indexed(
    f"""
UPDATE {TABLE} SET blocked = FALSE
WHERE id = (SELECT n.id FROM {TABLE} AS n
            WHERE {_on_target("n", ":ordering_key")} ORDER BY n.ordering_key, n.id LIMIT 1)
  AND ordering_key = :ordering_key AND blocked = TRUE
""",
    {"n": "ix_tether_jobs_target_active"},
)
# The stale-lock sweep's safety net for the flag: a target whose oldest active job is blocked (a
# tether from before the flag ended the job ahead of it while this one ran; two PostgreSQL
# transactions that each ended one of two jobs on a target at once) gets it unblocked. Asked
# first through the claim index (one entry when any job is blocked); then every active job with
# a target is read once, through its partial index, in a read transaction (no writer waits for
# it); each job found is unblocked only if it is still its target's oldest active job.
ANY_BLOCKED = f"SELECT 1 FROM {TABLE} WHERE status = 'pending' AND blocked = TRUE LIMIT 1"
LOST_HEADS = _sqlite_indexed(
    f"""
SELECT id FROM {TABLE}
WHERE blocked = TRUE AND id IN (
    SELECT min(a.id) FROM {TABLE} AS a
    WHERE a.{_ACTIVE} AND a.ordering_key IS NOT NULL GROUP BY a.ordering_key)
""",
    {"a": "ix_tether_jobs_target_active"},
)
UNBLOCK_HEAD = _sqlite_indexed(
    f"""
UPDATE {TABLE} SET blocked = FALSE
WHERE id = :id AND blocked = TRUE AND id = (
    SELECT n.id FROM {TABLE} AS n
    WHERE {_on_target("n", f"{TABLE}.ordering_key")} ORDER BY n.ordering_key, n.id LIMIT 1)
""",
    {"n": "ix_tether_jobs_target_active"},
)
# A ledger from before the flag (ensure_schema, once): its waiting jobs get it, read through the
# index of active jobs with a target (its condition repeated, so SQLite sees it applies).
BLOCK_WAITING = _sqlite_indexed(
    f"""
UPDATE {TABLE} INDEXED BY ix_tether_jobs_target_active
SET blocked = {_blocked(f"{TABLE}.id", f"{TABLE}.ordering_key", "sqlite")}
WHERE {ACTIVE_TARGETED_SQL} AND status = 'pending'
""",
    _ON_TARGET,
)

# Stale locks: the sweep reads a dead worker's jobs, then reclaim.py decides each one's edge and
# attempt count (kept for the job that ran alone, given back to a crashed batch's jobs). The
# transitions are fenced like a worker's own, and on the lock still being stale.
STALE = f"SELECT {_COLS} FROM {TABLE} WHERE status = 'claimed' AND locked_at < :cutoff"
# PostgreSQL: the database's clock, which lock times are measured by when machines share the
# ledger (clock.DatabaseClock): the time of this statement, not of its transaction's start.
DATABASE_TIME = "SELECT clock_timestamp()"
_STALE_FENCE = f"{_FENCE} AND locked_at < :cutoff"
RECLAIM = f"""
UPDATE {TABLE} SET status = 'pending', locked_by = NULL, locked_at = NULL,
                   attempts = :attempts, quarantine = :quarantine, last_error = :error
WHERE {_STALE_FENCE} RETURNING {_COLS}
"""
RECLAIM_EXHAUSTED = f"""
UPDATE {TABLE} SET status = 'failed', locked_by = NULL, locked_at = NULL, completed_at = :now,
                   attempts = :attempts, quarantine = :quarantine, last_error = :error
WHERE {_STALE_FENCE} RETURNING {_COLS}
"""
# A crashed batch's crash was charged to one of its jobs: the others no longer owe it (they
# stay quarantined). Not a status change.
ACQUIT = f"""
UPDATE {TABLE} SET quarantine = :acquitted
WHERE quarantine = :quarantine AND {QUARANTINED_SQL}
"""


def claim_sql(dialect: str, types: Iterable[str]) -> str:
    """The claim for a worker that has the job types ``types``."""
    names = ", ".join("'" + name.replace("'", "''") + "'" for name in sorted(types)) or "NULL"
    return (CLAIM_POSTGRES if dialect == "postgresql" else CLAIM_SQLITE).replace("{types}", names)


# -- per-type concurrency limits (max_running); used only when a registered type sets one ------
# The claim of the unlimited types is claim_sql(dialect, those types); each limited type is then
# claimed with claim_sql(dialect, [that type]), for up to its remaining room.

RUNNING_OF_TYPE = f"SELECT count(*) FROM {TABLE} WHERE type = :type AND status = 'claimed'"
# PostgreSQL: claims of one limited type wait for each other (held until commit), so two workers
# never both see room for the last slot; SQLite's single writer already orders them.
LOCK_TYPE_CLAIMS = "SELECT pg_advisory_xact_lock(hashtext(:lock))"


def insert_sql(dialect: str) -> tuple[str, str]:
    """(a job with an idempotency key, a job with a target and none): the one-row inserts."""
    if dialect == "postgresql":
        return INSERT_POSTGRES, INSERT_ON_TARGET_POSTGRES
    return INSERT, INSERT_ON_TARGET


def manual_retry_sql(dialect: str) -> str:
    return MANUAL_RETRY_POSTGRES if dialect == "postgresql" else MANUAL_RETRY


def complete_many_sql(dialect: str) -> str:
    """COMPLETE for many jobs, read from JSON (the dialects differ only in their JSON functions)."""
    return COMPLETE_MANY_POSTGRES if dialect == "postgresql" else COMPLETE_MANY_SQLITE


def insert_json_sql(dialect: str) -> tuple[str, str]:
    """(jobs without a target, jobs with one): the statements that read many jobs from JSON."""
    if dialect == "postgresql":
        return INSERT_PAYLOADS_POSTGRES, INSERT_TARGETED_POSTGRES
    return INSERT_PAYLOADS_SQLITE, INSERT_TARGETED_SQLITE


# -- reconcile (read-only; expanding ``IN`` lists are bound by reconcile.py) --------------------

# Every job with a target, in target order and, within one target, in enqueue order; with
# payloads when a probe needs them in this mode (one row lookup per job, cheaper than reading
# the latest ones by id afterwards). A job's type only when it completed (NULL: it is pending or
# claimed): one column fewer, and the driver releases the GIL once per column of every row.
# {payload}: see ``reconcile_page``.
RECONCILE_PAGE = f"""
SELECT id, CASE WHEN status = 'completed' THEN type END, ordering_key{{payload}} FROM {TABLE}
WHERE ordering_key IS NOT NULL AND (ordering_key, id) > (:after_key, :after_id)
  AND status IN ('pending', 'claimed', 'completed')
ORDER BY ordering_key, id
LIMIT :limit
"""
# The payload of the jobs whose types' probes read it in this mode; NULL for the others, whose
# rows are then never read from the table (the index holds the other columns, and SQLite seeks
# a row only when one of its columns is used).
RECONCILE_PAYLOAD = "CASE WHEN type IN ({types}) THEN payload END"


def reconcile_page(wanting: int) -> str:
    """RECONCILE_PAGE with the payloads of the jobs of ``wanting`` types (bound as ``:want_0``,
    ``:want_1``, ...)."""
    types = ", ".join(f":want_{n}" for n in range(wanting))
    return RECONCILE_PAGE.format(payload=f", {RECONCILE_PAYLOAD.format(types=types)}" if wanting else "")


# Payloads of the few latest completed jobs an existence check disagreed on (by primary key).
PAYLOADS_BY_ID = f"SELECT id, payload FROM {TABLE} WHERE id IN :ids"
# Asked again after the disk was read, for targets that disagreed: the latest completed job and
# whether one is active now, per target.
RECONCILE_RECHECK = f"""
SELECT ordering_key,
       max(CASE WHEN status = 'completed' THEN id END),
       max(CASE WHEN {_ACTIVE} THEN 1 ELSE 0 END)
FROM {TABLE} WHERE ordering_key IN :keys
GROUP BY ordering_key
"""
ACTIVE_ON_TARGET = f"SELECT 1 FROM {TABLE} WHERE ordering_key = :key AND {_ACTIVE} LIMIT 1"
KNOWN_TARGETS = f"SELECT DISTINCT ordering_key FROM {TABLE} WHERE ordering_key IN :keys"
COUNT_TARGETED = f"SELECT count(*) FROM {TABLE} WHERE ordering_key IS NOT NULL"
# Whether a job type has ever had a job on a target (reconcile's search for untracked remote
# resources); an index-only read of ix_tether_jobs_targeted, which holds the type.
TYPE_TARGETED = f"SELECT 1 FROM {TABLE} WHERE ordering_key IS NOT NULL AND type = :type LIMIT 1"
