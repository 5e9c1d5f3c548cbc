-- Every statement tether's hot path runs on a PostgreSQL ledger, complete as it is sent:
-- ``%(name)s`` parameters (psycopg's own), the table unqualified (tether's connections have the
-- ledger's schema alone on their search path; an application's transaction is given it for the
-- span of tether's statements, postgresql.py). sqlite.sql holds the same names for SQLite and
-- says what each one is for; the comments here say where PostgreSQL differs and why. Loaded by
-- name into ``catalogue.POSTGRESQL`` (catalogue.py); the claim's plan is checked in
-- tests/test_postgres_claim_plan.py.
--
-- PostgreSQL plans for itself: no statement here pins an index (SQLite's INDEXED BY). The
-- active jobs on one target are asked for as a range on ordering_key, never as ``ordering_key
-- = k``: with the key fixed by an equality PostgreSQL may walk any index in id order instead
-- (the primary key) and, on statistics that lag a drain (they still call the target's jobs
-- active), read every finished job older than the one it looks for; asked as NOT EXISTS, it
-- read the whole table per claim (benchmarks/README.md, hot_target.py).
--
-- Whether an older job on the target is active (INSERT*, MANUAL_RETRY): the older job found is
-- share-locked (the newest one: not the target's head, which a claim may be taking), so the
-- transaction that ends it waits for this one to commit and then sees the job it blocks. A job
-- that another transaction is changing at this moment (ending, claiming, unblocking or renewing
-- it) is passed over (SKIP LOCKED), never waited for, so an insert never waits here and cannot
-- be one side of a deadlock with those transactions (an insert of many jobs would take these
-- locks target after target while a group commit changed jobs of several targets in another
-- order). Passing over keeps the order exactly: the next older active job is asked instead
-- (locked, it ends only after this transaction commits, and its ending sees the new job); with
-- none left, the new job is not blocked, and the claim, which asks the rule itself, holds it
-- back while the job passed over is still active. A parameter also bound to a column is typed
-- by it; compared, it would be text: hence CAST(... AS varchar).

-- name: INSERT_UNKEYED
-- Jobs without an idempotency key cannot conflict: inserted in one executemany, no RETURNING
-- (the caller already knows every value).
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes, traceparent)
VALUES (%(id)s, %(type)s, %(payload)s, 'pending', %(priority)s, 0, %(max_attempts)s,
        %(created_at)s, %(run_at)s, %(idempotency_key)s, %(ordering_key)s, %(parent_id)s, %(timeout)s, %(payload_bytes)s, %(traceparent)s)

-- name: INSERT_ON_TARGET
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes, traceparent,
                         blocked)
VALUES (%(id)s, %(type)s, %(payload)s, 'pending', %(priority)s, 0, %(max_attempts)s,
        %(created_at)s, %(run_at)s, %(idempotency_key)s, %(ordering_key)s, %(parent_id)s, %(timeout)s, %(payload_bytes)s, %(traceparent)s,
        EXISTS (SELECT 1 FROM tether_jobs AS b
                WHERE b.ordering_key >= CAST(%(ordering_key)s AS varchar) AND b.ordering_key IS NOT NULL
                  AND b.status IN ('pending', 'claimed')
                  AND (b.ordering_key, b.id) < (CAST(%(ordering_key)s AS varchar), CAST(%(id)s AS varchar))
                ORDER BY b.ordering_key DESC, b.id DESC LIMIT 1 FOR SHARE SKIP LOCKED))

-- name: INSERT
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes, traceparent,
                         blocked)
VALUES (%(id)s, %(type)s, %(payload)s, 'pending', %(priority)s, 0, %(max_attempts)s,
        %(created_at)s, %(run_at)s, %(idempotency_key)s, %(ordering_key)s, %(parent_id)s, %(timeout)s, %(payload_bytes)s, %(traceparent)s,
        EXISTS (SELECT 1 FROM tether_jobs AS b
                WHERE b.ordering_key >= CAST(%(ordering_key)s AS varchar) AND b.ordering_key IS NOT NULL
                  AND b.status IN ('pending', 'claimed')
                  AND (b.ordering_key, b.id) < (CAST(%(ordering_key)s AS varchar), CAST(%(id)s AS varchar))
                ORDER BY b.ordering_key DESC, b.id DESC LIMIT 1 FOR SHARE SKIP LOCKED))
ON CONFLICT (type, idempotency_key) WHERE status IN ('pending', 'claimed') AND idempotency_key IS NOT NULL DO NOTHING
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: INSERT_PAYLOADS
-- JSON read by json_each_text; octet_length counts a text's bytes.
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes, traceparent)
SELECT key, %(type)s, value, 'pending', %(priority)s, 0, %(max_attempts)s,
       %(created_at)s, %(run_at)s, NULL, NULL, %(parent_id)s, %(timeout)s, octet_length(value), %(traceparent)s
FROM json_each_text(CAST(%(rows)s AS json))

-- name: INSERT_TARGETED
-- JSON read by json_array_elements and ->>, which reads text: PostgreSQL converts it only
-- when asked.
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes, traceparent,
                         blocked)
SELECT value ->> 0, %(type)s, value ->> 1, 'pending', %(priority)s, 0, %(max_attempts)s,
       %(created_at)s, %(run_at)s, NULL, value ->> 2, %(parent_id)s, %(timeout)s, CAST(value ->> 3 AS integer), %(traceparent)s,
       CASE WHEN CAST(value ->> 4 AS boolean) THEN TRUE ELSE
         EXISTS (SELECT 1 FROM tether_jobs AS b
                 WHERE b.ordering_key >= value ->> 2 AND b.ordering_key IS NOT NULL
                   AND b.status IN ('pending', 'claimed') AND (b.ordering_key, b.id) < (value ->> 2, value ->> 0)
                 ORDER BY b.ordering_key DESC, b.id DESC LIMIT 1 FOR SHARE SKIP LOCKED) END
FROM json_array_elements(CAST(%(rows)s AS json)) AS r(value)

-- name: INSERT_ROWS
-- None on PostgreSQL: a group commit's statements there go to the server in one round trip
-- (pipelined), each caller's jobs as a lone caller's go.

-- name: TAG
-- A tag of a job inserted in this transaction (ledger/notes.py): only jobs given tags pay for it.
INSERT INTO tether_job_tags (tag, job_id) VALUES (%(tag)s, %(job_id)s)

-- name: NOTE
-- The meta, and the failed job it retries, of a job inserted in this transaction: only jobs
-- given either pay for it.
UPDATE tether_jobs SET meta = %(meta)s, retry_of = %(retry_of)s WHERE id = %(id)s

-- name: ACTIVE_BY_KEY
SELECT id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
       created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
       timeout, progress, quarantine, payload_bytes, snoozes, traceparent
FROM tether_jobs
WHERE type = %(type)s AND idempotency_key = %(idempotency_key)s AND status IN ('pending', 'claimed')

-- name: GET
SELECT id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
       created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
       timeout, progress, quarantine, payload_bytes, snoozes, traceparent
FROM tether_jobs WHERE id = %(id)s

-- name: PAYLOAD
SELECT payload FROM tether_jobs WHERE id = %(id)s

-- name: CLAIM_PLAN
-- Sent before CLAIM in its transaction: the claim's generic plan is the one its custom plans
-- choose, but its estimated cost runs a little over theirs (:types of unknown length), so the
-- plan cache would plan every claim afresh (benchmarks/README.md). Transaction-local: the
-- connection's other statements keep the server's own choice.
SET LOCAL plan_cache_mode = force_generic_plan

-- name: CLAIM
-- The rules are sqlite.sql's; :types is an array of the registered type names
-- (catalogue.Statements.types). Concurrent claimers skip rows another transaction is claiming
-- instead of queueing behind its row locks (SQLite has one writer at a time and needs no such
-- clause). The candidates sit in a CTE because PostgreSQL may re-run an ``IN (... LIMIT n)``
-- subquery per outer row, claiming more than n jobs; a locking CTE is evaluated exactly once.
-- Claimed alone and bytes: the first of the (at most :limit) candidates it locked decides,
-- sorted in memory; a probe like SQLite's would walk the pending jobs again, which on
-- statistics that lag a freshly filled queue is a bitmap scan and sort of every pending job,
-- twice (benchmarks/README.md). Candidates left out (claimed alone, larger than ``fits``, past
-- what fits) stay pending; their row locks end with the transaction.
WITH next AS (
    SELECT j.id, (j.quarantine IS NULL AND j.attempts + 1 < j.max_attempts) AS plain,
           coalesce(j.payload_bytes, 0) AS size, j.priority, j.created_at
    FROM tether_jobs AS j
    WHERE j.status = 'pending' AND j.blocked = FALSE AND j.run_at <= %(now)s AND j.type = ANY(%(types)s)
      AND (j.ordering_key IS NULL OR j.id = (
          SELECT o.id FROM tether_jobs AS o
          WHERE o.ordering_key >= j.ordering_key AND o.ordering_key IS NOT NULL
            AND o.status IN ('pending', 'claimed')
          ORDER BY o.ordering_key, o.id LIMIT 1))
    ORDER BY j.priority DESC, j.created_at, j.id
    LIMIT %(limit)s FOR UPDATE OF j SKIP LOCKED),
first AS MATERIALIZED (
    SELECT n.id, n.plain, greatest(n.size, %(max_bytes)s / greatest(%(limit)s, 1), 1) AS fits
    FROM next AS n ORDER BY n.priority DESC, n.created_at, n.id LIMIT 1),
taken AS (
    SELECT n.id FROM next AS n, first AS f
    WHERE n.id = f.id OR (f.plain AND n.plain AND n.size <= f.fits)
    ORDER BY n.priority DESC, n.created_at, n.id
    LIMIT least(%(limit)s, greatest(1, %(max_bytes)s / (SELECT fits FROM first))))
UPDATE tether_jobs AS t SET status = 'claimed', locked_by = %(worker)s, locked_at = %(now)s,
                            claimed_at = %(now)s, attempts = t.attempts + 1
FROM taken
WHERE t.id = taken.id
RETURNING t.id, t.type, CASE WHEN coalesce(t.payload_bytes, 0) <= 16384 THEN t.payload END, t.status,
          t.priority, t.attempts, t.max_attempts, t.last_error, t.locked_by, t.locked_at, t.created_at,
          t.claimed_at, t.completed_at, t.run_at, t.idempotency_key, t.ordering_key, t.parent_id, t.result,
          t.timeout, t.progress, t.quarantine, t.payload_bytes, t.snoozes, t.traceparent

-- The transitions out of 'claimed' are fenced: they apply only to the worker's own attempt
-- (id, status 'claimed', locked_by, attempts), and a caller that gets no row back lost the job.

-- name: COMPLETE
UPDATE tether_jobs SET status = 'completed', locked_at = NULL,
                       completed_at = %(now)s, result = %(result)s,
                       fingerprint = CAST(CAST(%(result)s AS text) AS json) ->> 'fingerprint'
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: COMPLETE_MANY
-- :rows as in sqlite.sql; JSON read by json_each and ->>. No unary + here: PostgreSQL has
-- none on text, and its planner looks each id up by primary key without it.
UPDATE tether_jobs AS t SET status = 'completed', locked_at = NULL,
                            completed_at = CAST(r.value ->> 1 AS timestamptz), result = r.value ->> 2,
                            fingerprint = CAST(r.value ->> 2 AS json) ->> 'fingerprint'
FROM json_each(CAST(%(rows)s AS json)) AS r
WHERE t.id = r.key AND t.status = 'claimed' AND t.locked_by = %(worker)s
  AND t.attempts = CAST(r.value ->> 0 AS integer)
RETURNING t.id, t.attempts

-- name: CANCEL_RUNNING
-- An operator's cancel, seen by the worker running the job: cancelled, with the probe's verdict
-- on its effect in ``result``; its follow-up jobs are never inserted.
UPDATE tether_jobs SET status = 'cancelled', locked_by = NULL, locked_at = NULL,
                       completed_at = %(now)s, last_error = %(error)s, result = %(result)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: RETRY
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       run_at = %(run_at)s, last_error = %(error)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: FAIL
UPDATE tether_jobs SET status = 'failed', locked_by = NULL, locked_at = NULL,
                       completed_at = %(now)s, last_error = %(error)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: RELEASE
-- Cancelled at shutdown: the attempt is given back.
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = attempts - 1
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: DEFER
-- A snooze (a handler's Snooze, a rate limit's hold, a full data root): the attempt is given back
-- and the job waits until run_at; snoozed (1, or 0 for a full data root) counts it against
-- the worker's cap on snoozes.
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = attempts - 1, run_at = %(run_at)s, last_error = %(error)s,
                       snoozes = snoozes + %(snoozed)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- A worker's group commit records its jobs' outcomes without reading the rows back (it knows
-- them, and reading each back is a large part of a short job's cost): the same fenced row
-- changes as COMPLETE, RETRY, FAIL, RELEASE and DEFER, without RETURNING. The caller learns from
-- the count of rows changed whether it still held the job; tests/test_catalogue.py keeps each
-- one the statement it is named after, up to RETURNING.

-- name: COMPLETE_NO_RETURN
UPDATE tether_jobs SET status = 'completed', locked_at = NULL,
                       completed_at = %(now)s, result = %(result)s,
                       fingerprint = CAST(CAST(%(result)s AS text) AS json) ->> 'fingerprint'
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: CANCEL_RUNNING_NO_RETURN
UPDATE tether_jobs SET status = 'cancelled', locked_by = NULL, locked_at = NULL,
                       completed_at = %(now)s, last_error = %(error)s, result = %(result)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: RETRY_NO_RETURN
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       run_at = %(run_at)s, last_error = %(error)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: FAIL_NO_RETURN
UPDATE tether_jobs SET status = 'failed', locked_by = NULL, locked_at = NULL,
                       completed_at = %(now)s, last_error = %(error)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: RELEASE_NO_RETURN
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = attempts - 1
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: DEFER_NO_RETURN
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = attempts - 1, run_at = %(run_at)s, last_error = %(error)s,
                       snoozes = snoozes + %(snoozed)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: INSERT_ATTEMPT
INSERT INTO tether_attempts (job_id, attempt, started_at, ended_at, worker, outcome, error, traceparent)
VALUES (%(job_id)s, %(attempt)s, %(started_at)s, %(ended_at)s, %(worker)s, %(outcome)s, %(error)s, %(traceparent)s)

-- name: ATTEMPT_TRACE
SELECT traceparent FROM tether_attempts
WHERE job_id = %(job_id)s AND traceparent IS NOT NULL ORDER BY id DESC LIMIT 1
-- An operator's cancel (ledger/cancel.py), as in sqlite.sql.

-- name: CANCEL
UPDATE tether_jobs SET status = 'cancelled', completed_at = %(now)s, last_error = %(error)s
WHERE id = %(id)s AND status = 'pending'
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: REQUEST_CANCEL
UPDATE tether_jobs SET cancel_reason = %(reason)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: CANCEL_REQUESTS
SELECT id, cancel_reason FROM tether_jobs
WHERE locked_by = %(worker)s AND cancel_reason IS NOT NULL AND status = 'claimed'

-- name: PAUSED_TYPES
SELECT job_type FROM tether_paused

-- name: DEFER_TYPE
-- With DEFER: the type's other pending jobs wait until the reset too (not a status change).
UPDATE tether_jobs SET run_at = %(run_at)s WHERE type = %(type)s AND status = 'pending' AND run_at < %(run_at)s

-- name: HEARTBEAT
UPDATE tether_jobs SET locked_at = %(now)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: PROGRESS
-- A running handler's progress (throttled by the context): only while this worker holds the job.
UPDATE tether_jobs SET progress = %(progress)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: HOLDS
SELECT id FROM tether_jobs
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s

-- name: STANDING
-- After a group commit whose answer was lost (the connection died during COMMIT): where a job
-- stands, and whether it is still held for the attempt decided on. The claim's time is part of
-- the test: this worker may have claimed the job again since a lost commit released it.
SELECT status,
       CASE WHEN id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s
                 AND claimed_at = %(claimed_at)s THEN 1 ELSE 0 END
FROM tether_jobs WHERE id = %(id)s

-- name: NEWER_ON_TARGET
-- A failed job retried after a newer job on its target ran would undo the newer one.
SELECT id FROM tether_jobs
WHERE ordering_key = %(ordering_key)s AND id > %(id)s AND status IN ('pending', 'claimed', 'completed')
ORDER BY id LIMIT 1

-- name: RETRIED_AS
-- The job that already retried a failed job with a corrected payload, if any (ledger/corrected.py).
SELECT id FROM tether_jobs WHERE retry_of = %(id)s AND retry_of IS NOT NULL ORDER BY id LIMIT 1

-- name: NOTE_OF
-- A failed job's meta and tags (one row per tag, in no order; one row with a NULL tag if it has
-- none), which its retry with a corrected payload carries on.
SELECT j.meta, t.tag FROM tether_jobs AS j LEFT JOIN tether_job_tags AS t ON t.job_id = j.id
WHERE j.id = %(id)s

-- name: MANUAL_RETRY
UPDATE tether_jobs SET status = 'pending', attempts = 0, snoozes = 0, run_at = %(now)s, completed_at = NULL,
                       locked_by = NULL, locked_at = NULL, quarantine = NULL, cancel_reason = NULL,
                       blocked = EXISTS (
                           SELECT 1 FROM tether_jobs AS b
                           WHERE b.ordering_key >= tether_jobs.ordering_key AND b.ordering_key IS NOT NULL
                             AND b.status IN ('pending', 'claimed')
                             AND (b.ordering_key, b.id) < (tether_jobs.ordering_key, tether_jobs.id)
                           ORDER BY b.ordering_key DESC, b.id DESC LIMIT 1 FOR SHARE SKIP LOCKED)
WHERE id = %(id)s AND status = 'failed'
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: UNBLOCK_NEXT
-- A job on target %(ordering_key)s left the active set (completed, failed): the oldest active job
-- left on it may run now. Run after the job's own transition, in its transaction.
UPDATE tether_jobs SET blocked = FALSE
WHERE id = (SELECT n.id FROM tether_jobs AS n
            WHERE n.ordering_key >= %(ordering_key)s AND n.ordering_key IS NOT NULL
              AND n.status IN ('pending', 'claimed')
            ORDER BY n.ordering_key, n.id LIMIT 1)
  AND ordering_key = %(ordering_key)s AND blocked = TRUE

-- The stale-lock sweep's safety net for the flag: a target whose oldest active job is blocked
-- (a tether from before the flag ended the job ahead of it while this one ran; two PostgreSQL
-- transactions that each ended one of two jobs on a target at once) gets it unblocked. Asked
-- first through the claim index (ANY_BLOCKED: one entry when any job is blocked); then every
-- active job with a target is read once, through its partial index, in a read transaction
-- (LOST_HEADS: no writer waits for it); each job found is unblocked only if it is still its
-- target's oldest active job (UNBLOCK_HEAD).

-- name: ANY_BLOCKED
SELECT 1 FROM tether_jobs WHERE status = 'pending' AND blocked = TRUE LIMIT 1

-- name: LOST_HEADS
SELECT id FROM tether_jobs
WHERE blocked = TRUE AND id IN (
    SELECT min(a.id) FROM tether_jobs AS a
    WHERE a.status IN ('pending', 'claimed') AND a.ordering_key IS NOT NULL GROUP BY a.ordering_key)

-- name: UNBLOCK_HEAD
UPDATE tether_jobs SET blocked = FALSE
WHERE id = %(id)s AND blocked = TRUE AND id = (
    SELECT n.id FROM tether_jobs AS n
    WHERE n.ordering_key >= tether_jobs.ordering_key AND n.ordering_key IS NOT NULL
      AND n.status IN ('pending', 'claimed')
    ORDER BY n.ordering_key, n.id LIMIT 1)

-- name: BLOCK_WAITING
-- A ledger from before the flag (engine.ensure_schema, once, under its advisory lock): its
-- waiting jobs get it.
UPDATE tether_jobs
SET blocked = EXISTS (SELECT 1 FROM tether_jobs AS b
                      WHERE b.ordering_key >= tether_jobs.ordering_key AND b.ordering_key IS NOT NULL
                        AND b.status IN ('pending', 'claimed')
                        AND (b.ordering_key, b.id) < (tether_jobs.ordering_key, tether_jobs.id))
WHERE status IN ('pending', 'claimed') AND ordering_key IS NOT NULL AND status = 'pending'

-- Stale locks: the sweep reads a dead worker's jobs (STALE), then reclaim.py decides each one's
-- edge and attempt count (kept for the job that ran alone, given back to a crashed batch's
-- jobs). The transitions are fenced like a worker's own, and on the lock still being stale.

-- name: STALE
SELECT id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
       created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
       timeout, progress, quarantine, payload_bytes, snoozes, traceparent
FROM tether_jobs WHERE status = 'claimed' AND locked_at < %(cutoff)s

-- name: RECLAIM
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = %(attempts)s, quarantine = %(quarantine)s, last_error = %(error)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s AND locked_at < %(cutoff)s
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: RECLAIM_EXHAUSTED
UPDATE tether_jobs SET status = 'failed', locked_by = NULL, locked_at = NULL, completed_at = %(now)s,
                       attempts = %(attempts)s, quarantine = %(quarantine)s, last_error = %(error)s
WHERE id = %(id)s AND status = 'claimed' AND locked_by = %(worker)s AND attempts = %(attempt)s AND locked_at < %(cutoff)s
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: ACQUIT
-- A crashed batch's crash was charged to one of its jobs: the others no longer owe it (they stay
-- quarantined). Not a status change.
UPDATE tether_jobs SET quarantine = %(acquitted)s
WHERE quarantine = %(quarantine)s AND quarantine IS NOT NULL AND status IN ('pending', 'claimed')

-- Per-type concurrency limits (max_running), used only when a registered type sets one: the
-- claim of the unlimited types is CLAIM with those types; each limited type is then claimed
-- with CLAIM of that type alone, for up to its remaining room.

-- name: RUNNING_OF_TYPE
SELECT count(*) FROM tether_jobs WHERE type = %(type)s AND status = 'claimed'

-- name: LOCK_TYPE_CLAIMS
-- Claims of one limited type wait for each other (held until commit), so two workers never
-- both see room for the last slot.
SELECT pg_advisory_xact_lock(hashtext(%(lock)s))

-- name: LOCK_FOR_REPAIR
-- An applied repair plan checks that no planned target has had a job since the plan, then
-- enqueues: enqueues and transitions wait for it (and it for those in flight), so no job can
-- commit between the check and the repair's insert. It holds for the few statements of an apply.
LOCK TABLE tether_jobs IN SHARE ROW EXCLUSIVE MODE

-- name: WAITING_TYPES
-- As sqlite.sql's: the types of the first waiting jobs in claim order, through
-- ix_tether_jobs_queue.
SELECT type FROM tether_jobs
WHERE status = 'pending' AND blocked = FALSE
ORDER BY priority DESC, created_at, id LIMIT %(limit)s

-- name: PENDING_OF_TYPES
-- As sqlite.sql's: the pending jobs of :types, counted by type.
SELECT type, count(*) FROM tether_jobs
WHERE status = 'pending' AND type = ANY(%(types)s)
GROUP BY type ORDER BY type

-- name: JOBS_COUNTED
-- The rows of tether_jobs the planner's statistics count (-1: never gathered). A bulk enqueue
-- that grows the table by a tenth of that or more gathers them (ANALYZE_JOBS, enqueue.py): until
-- autovacuum does so, about a minute later, the planner takes a freshly filled queue for nearly
-- empty and each CLAIM sorts every pending job instead of walking ix_tether_jobs_queue.
SELECT reltuples FROM pg_class WHERE oid = 'tether_jobs'::regclass

-- name: ANALYZE_JOBS
ANALYZE tether_jobs

-- name: DATABASE_TIME
-- The database's clock, which lock times are measured by when machines share the ledger
-- (clock.DatabaseClock): the time of this statement, not of its transaction's start.
SELECT clock_timestamp()

-- Reconcile (read-only), as in sqlite.sql: a range of tether_targets, and in the same read
-- transaction the in-flight targets of that range.

-- name: RECONCILE_TARGETS
-- A page as one row, as in sqlite.sql: its size, its last key, a JSON array per column (as
-- text: the check parses it, not the driver). The aggregates take the range's rows in one
-- sequence, so position n of every array is one row; they sort nothing (an ORDER BY in each
-- would sort the page once per array), and nothing needs a page's targets in key order.
SELECT count(*), max(key), json_agg(job_id)::text, json_agg(type)::text,
       json_agg(key)::text, NULL, NULL
FROM (SELECT job_id, type, key FROM tether_targets
      WHERE key > %(after_key)s
      ORDER BY key
      LIMIT %(limit)s) AS page

-- name: RECONCILE_TARGETS_PAYLOADS
-- :want is an array of type names (catalogue.Statements.types); a payload larger than :largest
-- bytes is left NULL, as in sqlite.sql.
SELECT count(*), max(key), json_agg(job_id)::text, json_agg(type)::text,
       json_agg(key)::text, json_agg(payload)::text, NULL
FROM (SELECT t.job_id, t.type, t.key,
             CASE WHEN t.type = ANY(%(want)s)
                  THEN (SELECT CASE WHEN coalesce(j.payload_bytes, octet_length(j.payload)) <= %(largest)s
                                    THEN j.payload END
                        FROM tether_jobs AS j WHERE j.id = t.job_id) END AS payload
      FROM tether_targets AS t
      WHERE t.key > %(after_key)s
      ORDER BY t.key
      LIMIT %(limit)s) AS page

-- name: RECONCILE_TARGETS_FINGERPRINTS
-- As in sqlite.sql; :want is an array of type names.
SELECT count(*), max(key), json_agg(job_id)::text, json_agg(type)::text,
       json_agg(key)::text, json_agg(payload)::text,
       json_agg(fingerprint)::text
FROM (SELECT t.job_id, t.type, t.key,
             CASE WHEN t.type = ANY(%(want)s)
                  THEN (SELECT CASE WHEN coalesce(j.payload_bytes, octet_length(j.payload)) <= %(largest)s
                                    THEN j.payload END
                        FROM tether_jobs AS j WHERE j.id = t.job_id) END AS payload,
             t.fingerprint
      FROM tether_targets AS t
      WHERE t.key > %(after_key)s
      ORDER BY t.key
      LIMIT %(limit)s) AS page

-- name: RECONCILE_IN_FLIGHT
SELECT ordering_key, min(id) FROM tether_jobs
WHERE ordering_key IS NOT NULL AND status IN ('pending', 'claimed')
  AND ordering_key > %(after_key)s AND ordering_key <= %(through)s
GROUP BY ordering_key
ORDER BY ordering_key

-- name: RECONCILE_IN_FLIGHT_AFTER
SELECT ordering_key, min(id) FROM tether_jobs
WHERE ordering_key IS NOT NULL AND status IN ('pending', 'claimed') AND ordering_key > %(after_key)s
GROUP BY ordering_key
ORDER BY ordering_key
LIMIT %(limit)s

-- name: RECORD_FINGERPRINTS
-- As in sqlite.sql: :rows is a JSON object {id: fingerprint}.
UPDATE tether_jobs AS t SET fingerprint = r.value
FROM json_each_text(CAST(%(rows)s AS json)) AS r
WHERE t.id = r.key AND t.status = 'completed'

-- name: CLEAN_DIRS
-- As in sqlite.sql.
SELECT name, fingerprint FROM tether_clean_dirs WHERE parent = %(parent)s

-- name: RECORD_CLEAN_DIRS
-- As in sqlite.sql: :rows is a JSON array of [parent, name, fingerprint].
INSERT INTO tether_clean_dirs (parent, name, fingerprint)
SELECT r ->> 0, r ->> 1, r ->> 2 FROM json_array_elements(CAST(%(rows)s AS json)) AS r
ON CONFLICT (parent, name) DO UPDATE SET fingerprint = EXCLUDED.fingerprint

-- name: FORGET_CLEAN_DIRS
-- As in sqlite.sql: :rows is a JSON array of [parent, name].
DELETE FROM tether_clean_dirs AS d USING json_array_elements(CAST(%(rows)s AS json)) AS r
WHERE d.parent = r ->> 0 AND d.name = r ->> 1

-- name: COMMITS_UNSYNCED
-- Backend.transact_unsynced: this transaction's commit does not wait for its WAL to reach the
-- disk; the server writes it within moments, and a later synchronous commit flushes it first.
SET LOCAL synchronous_commit TO OFF

-- name: COMMITS_SYNCED
-- None on PostgreSQL: SET LOCAL ends with its transaction.

-- name: WORKER_START
-- A worker process registers itself (ledger/workers.py); its id is unique per process, so a
-- conflict is the same worker starting its loop again.
INSERT INTO tether_workers (id, host, pid, threads, version, started_at, beat_at, stopped_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(threads)s, %(version)s, %(now)s, %(now)s, NULL)
ON CONFLICT (id) DO UPDATE SET threads = EXCLUDED.threads, started_at = EXCLUDED.started_at,
  beat_at = EXCLUDED.beat_at, stopped_at = NULL

-- name: WORKER_BEAT
-- The heartbeat's mark that this worker is alive, in the transaction that renews its locks.
UPDATE tether_workers SET beat_at = %(now)s WHERE id = %(id)s

-- name: WORKER_STOP
UPDATE tether_workers SET beat_at = %(now)s, stopped_at = %(now)s WHERE id = %(id)s

-- name: WORKER_FORGET
-- Workers last heard of before the cutoff (stopped or dead), dropped when another starts, so the
-- table holds the workers of about a day.
DELETE FROM tether_workers WHERE beat_at < %(before)s

-- The targets table, as in sqlite.sql, with the same triggers on the same columns: they call one
-- function, told by their argument what happened to the row ('enter': inserted, 'leave':
-- deleted, 'update'). AFTER ... FOR EACH ROW triggers run at the end of their statement, so a
-- purge's recomputation sees the whole purge done. Concurrent completions on one target wait for
-- each other on its row (ON CONFLICT). The function names the tables unqualified, as every
-- statement here does: SQL by hand on the jobs of a ledger kept in a schema (``--schema``) runs
-- with that schema on its search path, or the trigger fails and the statement with it (nothing
-- is left half done).

-- name: TARGETS_FUNCTION
CREATE OR REPLACE FUNCTION tether_keep_targets() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  leaving boolean := TG_ARGV[0] = 'leave';
  entering boolean := TG_ARGV[0] = 'enter';
BEGIN
  IF TG_ARGV[0] = 'update' THEN
    leaving := OLD.status = 'completed' AND OLD.ordering_key IS NOT NULL
               AND (NEW.status <> 'completed' OR NEW.ordering_key IS DISTINCT FROM OLD.ordering_key);
    entering := NEW.status = 'completed' AND NEW.ordering_key IS NOT NULL;
  END IF;
  IF leaving THEN
    DELETE FROM tether_targets WHERE key = OLD.ordering_key AND job_id = OLD.id;
    INSERT INTO tether_targets (key, job_id, type, fingerprint)
    SELECT ordering_key, id, type, fingerprint FROM tether_jobs
    WHERE ordering_key IS NOT NULL AND ordering_key = OLD.ordering_key AND status = 'completed'
      AND NOT EXISTS (SELECT 1 FROM tether_targets WHERE key = OLD.ordering_key)
    ORDER BY id DESC LIMIT 1
    ON CONFLICT (key) DO NOTHING;
  END IF;
  IF entering THEN
    INSERT INTO tether_targets AS t (key, job_id, type, fingerprint)
    VALUES (NEW.ordering_key, NEW.id, NEW.type, NEW.fingerprint)
    ON CONFLICT (key) DO UPDATE SET job_id = EXCLUDED.job_id, type = EXCLUDED.type, fingerprint = EXCLUDED.fingerprint
    WHERE EXCLUDED.job_id >= t.job_id;
  END IF;
  RETURN NULL;
END
$$

-- name: TARGETS_ON_INSERT
CREATE TRIGGER tether_targets_on_insert AFTER INSERT ON tether_jobs FOR EACH ROW
WHEN (NEW.status = 'completed' AND NEW.ordering_key IS NOT NULL)
EXECUTE FUNCTION tether_keep_targets('enter')

-- name: TARGETS_ON_UPDATE
CREATE TRIGGER tether_targets_on_update
AFTER UPDATE OF completed_at, ordering_key, type, fingerprint ON tether_jobs FOR EACH ROW
WHEN ((OLD.status = 'completed' AND OLD.ordering_key IS NOT NULL)
      OR (NEW.status = 'completed' AND NEW.ordering_key IS NOT NULL))
EXECUTE FUNCTION tether_keep_targets('update')

-- name: TARGETS_ON_DELETE
CREATE TRIGGER tether_targets_on_delete AFTER DELETE ON tether_jobs FOR EACH ROW
WHEN (OLD.status = 'completed' AND OLD.ordering_key IS NOT NULL)
EXECUTE FUNCTION tether_keep_targets('leave')

-- name: TARGETS_TRIGGERS
SELECT tgname FROM pg_trigger WHERE tgrelid = 'tether_jobs'::regclass AND NOT tgisinternal

-- name: TARGETS_CLEAR
DELETE FROM tether_targets

-- name: TARGETS_FILL
-- Every target's latest completed job, into the empty table: one pass over the targeted jobs
-- (ix_tether_jobs_on_target), once per ledger.
INSERT INTO tether_targets (key, job_id, type, fingerprint)
SELECT DISTINCT ON (ordering_key) ordering_key, id, type, fingerprint FROM tether_jobs
WHERE ordering_key IS NOT NULL AND status = 'completed'
ORDER BY ordering_key, id DESC
