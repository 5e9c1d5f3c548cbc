"""Every hot statement, named, in one place. Each runs unchanged on SQLite and PostgreSQL unless
a comment says otherwise (``:name`` placeholders; backend.py adapts them per driver). The SQLite
plans are checked in tests/test_query_plans.py."""

from __future__ import annotations

from collections.abc import Iterable

from .schema import ACTIVE_KEYED_SQL, QUARANTINED_SQL, TABLE, jobs

COLUMNS = tuple(jobs.c.keys())
_COLS = ", ".join(COLUMNS)
_ACTIVE = "status IN ('pending', 'claimed')"
_FENCE = "id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt"

# Jobs without an idempotency key cannot conflict: inserted in one executemany, no RETURNING
# (the caller already knows every value).
INSERT_UNKEYED = f"""
INSERT INTO {TABLE} (id, type, payload, status, priority, attempts, max_attempts,
                     created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes)
VALUES (:id, :type, :payload, 'pending', :priority, 0, :max_attempts,
        :created_at, :run_at, :idempotency_key, :ordering_key, :parent_id, :timeout, :payload_bytes)
"""
# A keyed job: nothing is inserted while an active job of its type holds the key.
INSERT = f"""{INSERT_UNKEYED.rstrip()}
ON CONFLICT (type, idempotency_key) WHERE {ACTIVE_KEYED_SQL} DO NOTHING
RETURNING {_COLS}
"""

# Many unkeyed jobs of one type that share their options, in one statement: what varies travels
# as one JSON text: binding ten values per row through the driver cost twice SQLite's own insert.
# Jobs without a target go as an object {id: payload}, which the database walks without parsing
# each row again.
_INSERT_SELECT = """
INSERT INTO {table} (id, type, payload, status, priority, attempts, max_attempts,
                     created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes)
SELECT {id}, :type, {payload}, 'pending', :priority, 0, :max_attempts,
       :created_at, :run_at, NULL, {ordering_key}, :parent_id, :timeout, {payload_bytes}
FROM {rows}
"""
# The two dialects differ only in how they read JSON: SQLite's json_each / json_extract against
# PostgreSQL's json_each_text / json_array_elements and ->>, and in how they count a text's
# bytes (SQLite's length() counts characters, of a blob bytes).
_PAYLOADS = {"id": "key", "payload": "value", "ordering_key": "NULL"}
_TARGETED = ("id", "payload", "ordering_key", "payload_bytes")  # [id, payload, ordering_key, payload_bytes] rows
INSERT_PAYLOADS_SQLITE = _INSERT_SELECT.format(
    table=TABLE, rows="json_each(:rows)", payload_bytes="length(CAST(value AS BLOB))", **_PAYLOADS
)
INSERT_PAYLOADS_POSTGRES = _INSERT_SELECT.format(
    table=TABLE, rows="json_each_text(CAST(:rows AS json))", payload_bytes="octet_length(value)", **_PAYLOADS
)
INSERT_TARGETED_SQLITE = _INSERT_SELECT.format(
    table=TABLE, rows="json_each(:rows)", **{c: f"json_extract(value, '$[{i}]')" for i, c in enumerate(_TARGETED)}
)
INSERT_TARGETED_POSTGRES = _INSERT_SELECT.format(
    table=TABLE,
    rows="json_array_elements(CAST(:rows AS json)) AS r(value)",
    **{c: f"value ->> {i}" for i, c in enumerate(_TARGETED[:3])},
    payload_bytes="CAST(value ->> 3 AS integer)",  # ->> reads text: PostgreSQL converts it only when asked
)

ACTIVE_BY_KEY = f"""
SELECT {_COLS} FROM {TABLE}
WHERE type = :type AND idempotency_key = :idempotency_key AND {_ACTIVE}
"""

GET = f"SELECT {_COLS} FROM {TABLE} WHERE id = :id"


# A job waits while an older job on the same target (ordering_key) is still active, so writes
# to one path land in enqueue order even when the older one is retried. The IS NULL test is not
# redundant: without it PostgreSQL, on statistics that lag a freshly filled queue, plans the
# NOT EXISTS as an anti join reading every active job once per candidate.
# A worker claims only the types it has registered ({types}: their names as SQL literals, filled
# in by ``claim_sql``): a job of a type it lacks waits for a worker that has it, instead of
# burning its attempts on UnknownJobType. Literals, not a bound list: the planner sees a constant.
def _ready(j: str, o: str) -> str:
    """The claim's condition on candidate ``j`` (``o``: the alias of its target probe)."""
    return f"""{j}.status = 'pending' AND {j}.run_at <= :now AND {j}.type IN ({{types}})
  AND ({j}.ordering_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM {TABLE} AS {o}
      WHERE {o}.ordering_key = {j}.ordering_key AND {o}.{_ACTIVE} AND {o}.id < {j}.id))"""


_ORDER = "ORDER BY {j}.priority DESC, {j}.created_at, {j}.id"


# Claimed alone (issue 22): a job a worker died holding (quarantined), so a job that kills its
# worker takes no batch-mate down with it; and a job on its last attempt, so that a crash while it
# runs is pinned on it at once: in a batch nobody knows which job was running, and a poison job
# with one attempt left would otherwise be charged only at its next crash. The first ready job in
# claim order decides: claimed alone, the claim takes it alone; otherwise plain jobs.
#
# Bytes (issue 24): a batch holds at most :max_bytes of payload, or one job, so a worker's memory
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
# INDEXED BY pins both probes to their partial indexes: SQLite does not weigh a partial index's
# smaller size, and would otherwise sort the pending rows of a status index; should the index ever
# become unusable the statement fails to prepare instead of silently scanning.
CLAIM_SQLITE = (
    _CLAIM.format(table=TABLE, claimable=_CLAIMABLE_SQLITE, cols=_claimed_columns(""))
    .replace("WHERE status = 'pending' AND id IN", "WHERE +status = 'pending' AND id IN")
    .replace(f"FROM {TABLE} AS j\n", f"FROM {TABLE} AS j INDEXED BY ix_tether_jobs_pending\n")
    .replace(f"FROM {TABLE} AS h\n", f"FROM {TABLE} AS h INDEXED BY ix_tether_jobs_pending\n")
    .replace(f"FROM {TABLE} AS o\n", f"FROM {TABLE} AS o INDEXED BY ix_tether_jobs_target_active\n")
    .replace(f"FROM {TABLE} AS ho\n", f"FROM {TABLE} AS ho INDEXED BY ix_tether_jobs_target_active\n")
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

# A failed job retried after a newer job on its target ran would undo the newer one.
NEWER_ON_TARGET = f"""
SELECT id FROM {TABLE}
WHERE ordering_key = :ordering_key AND id > :id AND status IN ('pending', 'claimed', 'completed')
ORDER BY id LIMIT 1
"""

MANUAL_RETRY = f"""
UPDATE {TABLE} SET status = 'pending', attempts = 0, run_at = :now, completed_at = NULL,
                   locked_by = NULL, locked_at = NULL, quarantine = NULL
WHERE id = :id AND status = 'failed' RETURNING {_COLS}
"""

# Stale locks: the sweep reads a dead worker's jobs, then reclaim.py decides each one's edge and
# attempt count (kept for the job that ran alone, given back to a crashed batch's jobs). The
# transitions are fenced like a worker's own, and on the lock still being stale.
STALE = f"SELECT {_COLS} FROM {TABLE} WHERE status = 'claimed' AND locked_at < :cutoff"
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
# the latest ones by id afterwards). {payload}: "" or ", payload".
RECONCILE_PAGE = f"""
SELECT id, type, status, ordering_key{{payload}} FROM {TABLE}
WHERE ordering_key IS NOT NULL AND (ordering_key, id) > (:after_key, :after_id)
  AND status IN ('pending', 'claimed', 'completed')
ORDER BY ordering_key, id
LIMIT :limit
"""
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
