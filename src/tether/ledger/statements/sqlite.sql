-- Every statement tether's hot path runs on a SQLite ledger, complete as it is sent: named
-- ``:name`` parameters (the sqlite3 module's own; the inserts number theirs, below), INDEXED BY
-- where a statement must read through one index. postgresql.sql holds the same names for
-- PostgreSQL; a comment says where they differ and why. Loaded by name into
-- ``catalogue.SQLITE`` (catalogue.py); the plans are checked in tests/test_query_plans.py.
--
-- INDEXED BY: SQLite does not weigh a partial index's smaller size, so each probe of the
-- active jobs on a target (alias b, n, o, ho, a) is pinned to ix_tether_jobs_target_active and
-- each walk of the waiting jobs (j, h) to ix_tether_jobs_queue; should an index ever become
-- unusable, the statement fails to prepare instead of silently scanning the table.
--
-- The order per target: a job with a target (ordering_key) waits while an older job on that
-- target is active. A job known to wait is ``blocked``: the claim walks ix_tether_jobs_queue,
-- which puts blocked jobs apart, so a target's backlog costs the claim nothing. The flag is set
-- when a job enters the active set (INSERT*, MANUAL_RETRY) and cleared, for the oldest active
-- job left on a target, when a job on it ends (UNBLOCK_NEXT). The claim still asks the rule
-- itself: a flag missing (a ledger from before it, two racing enqueues) costs speed, never
-- order. The active jobs on one target are a range of ix_tether_jobs_target_active, asked for
-- as a range on ordering_key (``>= k`` or a row value), never as ``ordering_key = k``: with the
-- key fixed by an equality PostgreSQL may walk another index in id order (postgresql.sql says
-- why); both files spell it alike.

-- The three inserts of one job number their parameters rather than name them: the driver binds
-- a tuple by position, where a name costs it a string made and looked up per value, on every
-- enqueue. The values, in order (SQLiteBackend.insert_values): ?1 id, ?2 type, ?3 payload,
-- ?4 priority, ?5 max_attempts, ?6 created_at, ?7 run_at, ?8 parent_id, ?9 timeout,
-- ?10 payload_bytes, ?11 traceparent, ?12 ordering_key, ?13 idempotency_key. Each insert takes
-- only the values its jobs may have (INSERT_UNKEYED ?1-?11, INSERT_ON_TARGET ?1-?12, INSERT all):
-- the driver binds each None it is given through its adapter look-up, dearer than any other value.
-- For the same reason a job's usual absences travel as values it can never have, which NULLIF
-- makes NULL: no parent_id '' (ids are never empty), no timeout 0 (a timeout is > 0), no
-- traceparent ''.

-- name: INSERT_UNKEYED
-- Jobs without an idempotency key cannot conflict: inserted in one executemany, no RETURNING
-- (the caller already knows every value).
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, parent_id, timeout, payload_bytes, traceparent)
VALUES (?1, ?2, ?3, 'pending', ?4, 0, ?5,
        ?6, ?7, NULLIF(?8, ''), NULLIF(?9, 0), ?10, NULLIF(?11, ''))

-- name: INSERT_ON_TARGET
-- A job with a target and no key: INSERT_UNKEYED, blocked if an older job on the target is
-- active.
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, parent_id, timeout, payload_bytes, traceparent, ordering_key,
                         blocked)
VALUES (?1, ?2, ?3, 'pending', ?4, 0, ?5,
        ?6, ?7, NULLIF(?8, ''), NULLIF(?9, 0), ?10, NULLIF(?11, ''), ?12,
        EXISTS (SELECT 1 FROM tether_jobs AS b INDEXED BY ix_tether_jobs_target_active
                WHERE b.ordering_key >= ?12 AND b.ordering_key IS NOT NULL
                  AND b.status IN ('pending', 'claimed') AND (b.ordering_key, b.id) < (?12, ?1)))

-- name: INSERT
-- A keyed job: INSERT_ON_TARGET, and nothing is inserted while an active job of its type holds
-- the key (the caller then reads that one, ACTIVE_BY_KEY).
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, parent_id, timeout, payload_bytes, traceparent, ordering_key,
                         idempotency_key, blocked)
VALUES (?1, ?2, ?3, 'pending', ?4, 0, ?5,
        ?6, ?7, NULLIF(?8, ''), NULLIF(?9, 0), ?10, NULLIF(?11, ''), ?12, ?13,
        EXISTS (SELECT 1 FROM tether_jobs AS b INDEXED BY ix_tether_jobs_target_active
                WHERE b.ordering_key >= ?12 AND b.ordering_key IS NOT NULL
                  AND b.status IN ('pending', 'claimed') AND (b.ordering_key, b.id) < (?12, ?1)))
ON CONFLICT (type, idempotency_key) WHERE status IN ('pending', 'claimed') AND idempotency_key IS NOT NULL DO NOTHING
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: INSERT_PAYLOADS
-- Many unkeyed jobs of one type that share their options, without a target, in one statement:
-- what varies travels as one JSON object {id: payload}, which the database walks without
-- parsing each row again (binding ten values per row through the driver cost twice SQLite's own
-- insert). length() of a blob counts bytes (of a text, characters).
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes, traceparent)
SELECT key, :type, value, 'pending', :priority, 0, :max_attempts,
       :created_at, :run_at, NULL, NULL, :parent_id, :timeout, length(CAST(value AS BLOB)), :traceparent
FROM json_each(:rows)

-- name: INSERT_TARGETED
-- INSERT_PAYLOADS for jobs with a target: rows [id, payload, ordering_key, payload_bytes,
-- behind]; ``behind`` is true when an older job of the same statement has the same target (the
-- statement does not see its own rows), else the ledger is asked as INSERT_ON_TARGET asks it.
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes, traceparent,
                         blocked)
SELECT json_extract(value, '$[0]'), :type, json_extract(value, '$[1]'), 'pending', :priority, 0, :max_attempts,
       :created_at, :run_at, NULL, json_extract(value, '$[2]'), :parent_id, :timeout, json_extract(value, '$[3]'), :traceparent,
       CASE WHEN json_extract(value, '$[4]') THEN TRUE ELSE
         EXISTS (SELECT 1 FROM tether_jobs AS b INDEXED BY ix_tether_jobs_target_active
                 WHERE b.ordering_key >= json_extract(value, '$[2]') AND b.ordering_key IS NOT NULL
                   AND b.status IN ('pending', 'claimed')
                   AND (b.ordering_key, b.id) < (json_extract(value, '$[2]'), json_extract(value, '$[0]'))) END
FROM json_each(:rows)

-- name: INSERT_ROWS
-- The jobs of a group commit's callers (enqueue.py: none with a key or notes) in one statement:
-- rows [id, type, payload, priority, max_attempts, created_at, run_at, parent_id, timeout,
-- payload_bytes, traceparent] as INSERT_UNKEYED binds them (absences as values no job has), then
-- [ordering_key, behind], ``behind`` as INSERT_TARGETED's. One
-- statement rather than one a caller: the driver lets go of the interpreter's lock for each
-- statement, and the committing thread then waits to take it back from the callers building
-- their next jobs. Alone in its transaction, it runs as a transaction of its own (sqlite.py:
-- _WriteCursor): one statement for the inserts, the commit and its fsync.
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes, traceparent,
                         blocked)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), 'pending',
       json_extract(value, '$[3]'), 0, json_extract(value, '$[4]'), json_extract(value, '$[5]'),
       json_extract(value, '$[6]'), NULL, json_extract(value, '$[11]'), NULLIF(json_extract(value, '$[7]'), ''),
       NULLIF(json_extract(value, '$[8]'), 0), json_extract(value, '$[9]'), NULLIF(json_extract(value, '$[10]'), ''),
       CASE WHEN json_extract(value, '$[11]') IS NULL THEN FALSE WHEN json_extract(value, '$[12]') THEN TRUE ELSE
         EXISTS (SELECT 1 FROM tether_jobs AS b INDEXED BY ix_tether_jobs_target_active
                 WHERE b.ordering_key >= json_extract(value, '$[11]') AND b.ordering_key IS NOT NULL
                   AND b.status IN ('pending', 'claimed')
                   AND (b.ordering_key, b.id) < (json_extract(value, '$[11]'), json_extract(value, '$[0]'))) END
FROM json_each(:rows)

-- name: TAG
-- A tag of a job inserted in this transaction (ledger/notes.py): only jobs given tags pay for it.
INSERT INTO tether_job_tags (tag, job_id) VALUES (:tag, :job_id)

-- name: NOTE
-- The meta, and the failed job it retries, of a job inserted in this transaction: only jobs
-- given either pay for it.
UPDATE tether_jobs SET meta = :meta, retry_of = :retry_of WHERE id = :id

-- name: ACTIVE_BY_KEY
SELECT id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
       created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
       timeout, progress, quarantine, payload_bytes, snoozes, traceparent
FROM tether_jobs
WHERE type = :type AND idempotency_key = :idempotency_key AND status IN ('pending', 'claimed')

-- name: GET
SELECT id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
       created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
       timeout, progress, quarantine, payload_bytes, snoozes, traceparent
FROM tether_jobs WHERE id = :id

-- name: PAYLOAD
-- A claimed job's payload that CLAIM left out (over catalogue.INLINE_PAYLOAD bytes).
SELECT payload FROM tether_jobs WHERE id = :id

-- name: CLAIM_PLAN
-- None on SQLite: sqlite3 keeps each statement compiled, with no choice of plan by its values.

-- name: CLAIM
-- Up to :limit ready jobs of the types a worker has registered (:types, a JSON array of their
-- names: catalogue.Statements.types), so a job of a type it lacks waits for a worker that has
-- it instead of burning its attempts on UnknownJobType. Ready: pending, not blocked, due, and
-- the oldest active job on its target, the first entry of its target's range of
-- ix_tether_jobs_target_active (the IS NULL test keeps PostgreSQL, on statistics that lag a
-- freshly filled queue, from planning the probe as a join over every active job).
--
-- Claimed alone: a job a dead worker held (quarantined), so a job that kills its worker takes no
-- batch-mate down with it; and a job on its last attempt, so a crash while it runs is pinned on
-- it at once. Bytes: a batch holds at most :max_bytes of payload, or one job. The first ready
-- job in claim order decides both: claimed alone, it is taken alone; otherwise every job of the
-- batch holds at most ``fits`` bytes (the first job's, or the batch's even share :max_bytes /
-- :limit if more), and as many as fit are taken, in order (at least one, at most :limit). These
-- are conditions on each row's payload_bytes: no payload is read to decide, no window sums the
-- candidates (benchmarks/README.md).
--
-- SQLite: ``first`` probes that first ready job with the same conditions as the candidates,
-- reading one entry of ix_tether_jobs_queue (sorting the chosen candidates again would need a
-- temp B-tree, which the plan tests forbid); materialised, so the WHERE and the LIMIT read one
-- evaluation of it: ``fits``, -1 when that job is claimed alone, 1 when there is none. The
-- unary + on the outer guard keeps the planner from walking the claim index over every pending
-- row to re-check it: the chosen ids are looked up by primary key.
--
-- The types: SQLite answers ``IN (SELECT ...)`` from a temporary index it builds on every run
-- of the statement, cheap beside a batch's candidates (j) but dearer than the row or two
-- ``first`` reads, where each row read is asked with EXISTS instead (a claim of one job, a hot
-- target's, would otherwise build two; benchmarks/README.md).
--
-- Payloads of up to catalogue.INLINE_PAYLOAD (16384) bytes come back with the rows; larger ones
-- come back NULL and are read after, one at a time (PAYLOAD): SQLite holds every RETURNING row
-- until the statement ends, beside the row it rewrote (benchmarks/README.md).
UPDATE tether_jobs SET status = 'claimed', locked_by = :worker, locked_at = :now,
                       claimed_at = :now, attempts = attempts + 1
WHERE +status = 'pending' AND id IN (
    WITH first(fits) AS MATERIALIZED (SELECT coalesce((
        SELECT CASE WHEN (h.quarantine IS NULL AND h.attempts + 1 < h.max_attempts)
                    THEN max(coalesce(h.payload_bytes, 0), :max_bytes / max(:limit, 1), 1) ELSE -1 END
        FROM tether_jobs AS h INDEXED BY ix_tether_jobs_queue
        WHERE h.status = 'pending' AND h.blocked = FALSE AND h.run_at <= :now
          AND EXISTS (SELECT 1 FROM json_each(:types) WHERE value = h.type)
          AND (h.ordering_key IS NULL OR h.id = (
              SELECT ho.id FROM tether_jobs AS ho INDEXED BY ix_tether_jobs_target_active
              WHERE ho.ordering_key >= h.ordering_key AND ho.ordering_key IS NOT NULL
                AND ho.status IN ('pending', 'claimed')
              ORDER BY ho.ordering_key, ho.id LIMIT 1))
        ORDER BY h.priority DESC, h.created_at, h.id LIMIT 1), 1))
    SELECT j.id FROM tether_jobs AS j INDEXED BY ix_tether_jobs_queue
    WHERE j.status = 'pending' AND j.blocked = FALSE AND j.run_at <= :now
      AND j.type IN (SELECT value FROM json_each(:types))
      AND (j.ordering_key IS NULL OR j.id = (
          SELECT o.id FROM tether_jobs AS o INDEXED BY ix_tether_jobs_target_active
          WHERE o.ordering_key >= j.ordering_key AND o.ordering_key IS NOT NULL
            AND o.status IN ('pending', 'claimed')
          ORDER BY o.ordering_key, o.id LIMIT 1))
      AND CASE WHEN (SELECT fits FROM first) < 0
               THEN NOT (j.quarantine IS NULL AND j.attempts + 1 < j.max_attempts)
               ELSE (j.quarantine IS NULL AND j.attempts + 1 < j.max_attempts)
                    AND coalesce(j.payload_bytes, 0) <= (SELECT fits FROM first) END
    ORDER BY j.priority DESC, j.created_at, j.id
    LIMIT CASE WHEN (SELECT fits FROM first) < 0 THEN min(:limit, 1)
               ELSE min(:limit, max(1, :max_bytes / (SELECT fits FROM first))) END)
RETURNING id, type, CASE WHEN coalesce(payload_bytes, 0) <= 16384 THEN payload END, status, priority,
          attempts, max_attempts, last_error, locked_by, locked_at, created_at, claimed_at, completed_at,
          run_at, idempotency_key, ordering_key, parent_id, result, timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- The transitions out of 'claimed' are fenced: they apply only to the worker's own attempt
-- (id, status 'claimed', locked_by, attempts), and a caller that gets no row back lost the job.

-- name: COMPLETE
-- locked_by stays, naming the worker that ran the completing attempt: no attempt row is written
-- for it (INSERT_ATTEMPT). The lock itself is locked_at with status 'claimed'.
-- A file job's result holds its file's fingerprint: copied to its column, where a content check
-- reads it (jobtypes/datafiles/fingerprint.py); NULL for any other result.
UPDATE tether_jobs SET status = 'completed', locked_at = NULL,
                       completed_at = :now, result = :result, fingerprint = json_extract(:result, '$.fingerprint')
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: COMPLETE_MANY
-- COMPLETE for many of one worker's jobs in one statement, fenced row by row exactly as
-- COMPLETE is; :rows is a JSON object {id: [attempt, completed_at, result]}, and the (id,
-- attempts) returned are the jobs that moved (the others lost their lease). The unary + keeps
-- the planner from walking every claimed job's status entry once per row: it reads the JSON and
-- looks each id up by primary key.
UPDATE tether_jobs SET status = 'completed', locked_at = NULL,
                       completed_at = json_extract(r.value, '$[1]'), result = json_extract(r.value, '$[2]'),
                       fingerprint = json_extract(json_extract(r.value, '$[2]'), '$.fingerprint')
FROM json_each(:rows) AS r
WHERE tether_jobs.id = r.key AND +tether_jobs.status = 'claimed' AND tether_jobs.locked_by = :worker
  AND tether_jobs.attempts = json_extract(r.value, '$[0]')
RETURNING tether_jobs.id, tether_jobs.attempts

-- name: CANCEL_RUNNING
-- An operator's cancel, seen by the worker running the job: cancelled, with the probe's verdict
-- on its effect in ``result``; its follow-up jobs are never inserted.
UPDATE tether_jobs SET status = 'cancelled', locked_by = NULL, locked_at = NULL,
                       completed_at = :now, last_error = :error, result = :result
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: RETRY
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       run_at = :run_at, last_error = :error
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: FAIL
UPDATE tether_jobs SET status = 'failed', locked_by = NULL, locked_at = NULL,
                       completed_at = :now, last_error = :error
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: RELEASE
-- Cancelled at shutdown: the attempt is given back.
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = attempts - 1
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: DEFER
-- A snooze (a handler's Snooze, a rate limit's hold, a full data root): the attempt is given back
-- and the job waits until :run_at; :snoozed (1, or 0 for a full data root) counts it against
-- the worker's cap on snoozes.
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = attempts - 1, run_at = :run_at, last_error = :error,
                       snoozes = snoozes + :snoozed
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt
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
                       completed_at = :now, result = :result, fingerprint = json_extract(:result, '$.fingerprint')
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: CANCEL_RUNNING_NO_RETURN
UPDATE tether_jobs SET status = 'cancelled', locked_by = NULL, locked_at = NULL,
                       completed_at = :now, last_error = :error, result = :result
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: RETRY_NO_RETURN
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       run_at = :run_at, last_error = :error
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: FAIL_NO_RETURN
UPDATE tether_jobs SET status = 'failed', locked_by = NULL, locked_at = NULL,
                       completed_at = :now, last_error = :error
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: RELEASE_NO_RETURN
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = attempts - 1
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: DEFER_NO_RETURN
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = attempts - 1, run_at = :run_at, last_error = :error,
                       snoozes = snoozes + :snoozed
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: INSERT_ATTEMPT
-- How an attempt that did not complete its job ended (attempts.py), written by the transition
-- that ends it, in its transaction: the worker's group commit, the sweep, an operator's retry.
-- A completion writes none: the completed row keeps the attempt whole, locked_by included
-- (COMPLETE leaves it as the worker that ran the job; locked_at, the lock, goes).
INSERT INTO tether_attempts (job_id, attempt, started_at, ended_at, worker, outcome, error, traceparent)
VALUES (:job_id, :attempt, :started_at, :ended_at, :worker, :outcome, :error, :traceparent)

-- name: ATTEMPT_TRACE
-- The span of a job's latest traced attempt that did not complete it, which the next attempt's
-- span links to (tether/tracing.py): asked only while traces are recorded, for a job that ran
-- before; one probe of ix_tether_attempts_job from its end.
SELECT traceparent FROM tether_attempts
WHERE job_id = :job_id AND traceparent IS NOT NULL ORDER BY id DESC LIMIT 1
-- An operator's cancel (ledger/cancel.py). A pending job is cancelled at once (CANCEL, which
-- takes it out of the active set: the caller then runs UNBLOCK_NEXT); a running one is asked to
-- stop (REQUEST_CANCEL), fenced on the attempt the operator saw, and its worker reads the
-- requests for the jobs it holds (CANCEL_REQUESTS, through the partial index of exactly those
-- rows: empty while nobody cancels) about twice a second while it runs any.

-- name: CANCEL
UPDATE tether_jobs SET status = 'cancelled', completed_at = :now, last_error = :error
WHERE id = :id AND status = 'pending'
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: REQUEST_CANCEL
UPDATE tether_jobs SET cancel_reason = :reason
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: CANCEL_REQUESTS
SELECT id, cancel_reason FROM tether_jobs INDEXED BY ix_tether_jobs_cancel_requested
WHERE locked_by = :worker AND cancel_reason IS NOT NULL AND status = 'claimed'

-- name: PAUSED_TYPES
-- The job types an operator paused (ledger/pausing.py): a worker leaves them out of CLAIM's
-- :types, so the claim's plan is the same whatever is paused.
SELECT job_type FROM tether_paused

-- name: DEFER_TYPE
-- With DEFER: the type's other pending jobs wait until the reset too (not a status change).
UPDATE tether_jobs SET run_at = :run_at WHERE type = :type AND status = 'pending' AND run_at < :run_at

-- name: HEARTBEAT
UPDATE tether_jobs SET locked_at = :now
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: PROGRESS
-- A running handler's progress (throttled by the context): only while this worker holds the job.
UPDATE tether_jobs SET progress = :progress
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: HOLDS
SELECT id FROM tether_jobs
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt

-- name: STANDING
-- After a group commit whose answer was lost (the connection died during COMMIT): where a job
-- stands, and whether it is still held for the attempt decided on. The claim's time is part of
-- the test: this worker may have claimed the job again since a lost commit released it.
SELECT status,
       CASE WHEN id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt
                 AND claimed_at = :claimed_at THEN 1 ELSE 0 END
FROM tether_jobs WHERE id = :id

-- name: NEWER_ON_TARGET
-- A failed job retried after a newer job on its target ran would undo the newer one.
SELECT id FROM tether_jobs
WHERE ordering_key = :ordering_key AND id > :id AND status IN ('pending', 'claimed', 'completed')
ORDER BY id LIMIT 1

-- name: RETRIED_AS
-- The job that already retried failed job :id with a corrected payload, if any (ledger/corrected.py).
SELECT id FROM tether_jobs WHERE retry_of = :id AND retry_of IS NOT NULL ORDER BY id LIMIT 1

-- name: NOTE_OF
-- A failed job's meta and tags (one row per tag, in no order; one row with a NULL tag if it has
-- none), which its retry with a corrected payload carries on.
SELECT j.meta, t.tag FROM tether_jobs AS j LEFT JOIN tether_job_tags AS t ON t.job_id = j.id
WHERE j.id = :id

-- name: MANUAL_RETRY
-- An operator's retry of a failed job: back in the active set, blocked if an older job on its
-- target is active (a newer one cannot be: NEWER_ON_TARGET refuses the retry first).
UPDATE tether_jobs SET status = 'pending', attempts = 0, snoozes = 0, run_at = :now, completed_at = NULL,
                       locked_by = NULL, locked_at = NULL, quarantine = NULL, cancel_reason = NULL,
                       blocked = EXISTS (
                           SELECT 1 FROM tether_jobs AS b INDEXED BY ix_tether_jobs_target_active
                           WHERE b.ordering_key >= tether_jobs.ordering_key AND b.ordering_key IS NOT NULL
                             AND b.status IN ('pending', 'claimed')
                             AND (b.ordering_key, b.id) < (tether_jobs.ordering_key, tether_jobs.id))
WHERE id = :id AND status = 'failed'
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: UNBLOCK_NEXT
-- A job on target :ordering_key left the active set (completed, failed): the oldest active job
-- left on it may run now. Run after the job's own transition, in its transaction.
UPDATE tether_jobs SET blocked = FALSE
WHERE id = (SELECT n.id FROM tether_jobs AS n INDEXED BY ix_tether_jobs_target_active
            WHERE n.ordering_key >= :ordering_key AND n.ordering_key IS NOT NULL
              AND n.status IN ('pending', 'claimed')
            ORDER BY n.ordering_key, n.id LIMIT 1)
  AND ordering_key = :ordering_key AND blocked = TRUE

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
    SELECT min(a.id) FROM tether_jobs AS a INDEXED BY ix_tether_jobs_target_active
    WHERE a.status IN ('pending', 'claimed') AND a.ordering_key IS NOT NULL GROUP BY a.ordering_key)

-- name: UNBLOCK_HEAD
UPDATE tether_jobs SET blocked = FALSE
WHERE id = :id AND blocked = TRUE AND id = (
    SELECT n.id FROM tether_jobs AS n INDEXED BY ix_tether_jobs_target_active
    WHERE n.ordering_key >= tether_jobs.ordering_key AND n.ordering_key IS NOT NULL
      AND n.status IN ('pending', 'claimed')
    ORDER BY n.ordering_key, n.id LIMIT 1)

-- name: BLOCK_WAITING
-- A ledger from before the flag (engine.ensure_schema, once): its waiting jobs get it, read
-- through the index of active jobs with a target (its condition repeated, so SQLite sees that
-- it applies).
UPDATE tether_jobs INDEXED BY ix_tether_jobs_target_active
SET blocked = EXISTS (SELECT 1 FROM tether_jobs AS b INDEXED BY ix_tether_jobs_target_active
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
FROM tether_jobs WHERE status = 'claimed' AND locked_at < :cutoff

-- name: RECLAIM
UPDATE tether_jobs SET status = 'pending', locked_by = NULL, locked_at = NULL,
                       attempts = :attempts, quarantine = :quarantine, last_error = :error
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt AND locked_at < :cutoff
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: RECLAIM_EXHAUSTED
UPDATE tether_jobs SET status = 'failed', locked_by = NULL, locked_at = NULL, completed_at = :now,
                       attempts = :attempts, quarantine = :quarantine, last_error = :error
WHERE id = :id AND status = 'claimed' AND locked_by = :worker AND attempts = :attempt AND locked_at < :cutoff
RETURNING id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at,
          created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result,
          timeout, progress, quarantine, payload_bytes, snoozes, traceparent

-- name: ACQUIT
-- A crashed batch's crash was charged to one of its jobs: the others no longer owe it (they stay
-- quarantined). Not a status change.
UPDATE tether_jobs SET quarantine = :acquitted
WHERE quarantine = :quarantine AND quarantine IS NOT NULL AND status IN ('pending', 'claimed')

-- Per-type concurrency limits (max_running), used only when a registered type sets one: the
-- claim of the unlimited types is CLAIM with those types; each limited type is then claimed
-- with CLAIM of that type alone, for up to its remaining room.

-- name: RUNNING_OF_TYPE
SELECT count(*) FROM tether_jobs WHERE type = :type AND status = 'claimed'

-- name: LOCK_TYPE_CLAIMS
-- SQLite's single writer already orders claims of one limited type: nothing to lock.
SELECT :lock

-- name: LOCK_FOR_REPAIR
-- As postgresql.sql's: SQLite's write lock, taken when the apply's transaction begins, already
-- keeps every other writer out between its check and its insert.
SELECT 1

-- name: WAITING_TYPES
-- The types of the first :limit waiting jobs in claim order (the unblocked entries of
-- ix_tether_jobs_queue): what a worker reads when it starts and when it runs out of work, to
-- name the pending jobs whose types it lacks (Queue.pending_unserved), so that a job of a type
-- no worker has registered does not wait unseen. The head of the queue, not all of it, so the
-- read costs the same however many jobs wait: a worker runs out of work only once the ready jobs
-- of its own types are gone from that head, and a blocked job waits behind its target's oldest
-- active job, which the head shows or a worker is running. Not on the claim path.
SELECT type FROM tether_jobs INDEXED BY ix_tether_jobs_queue
WHERE status = 'pending' AND blocked = FALSE
ORDER BY priority DESC, created_at, id LIMIT :limit

-- name: PENDING_OF_TYPES
-- The pending jobs of :types (those WAITING_TYPES found that a worker lacks), counted by type:
-- read only when there is something to name, and then exactly.
SELECT type, count(*) FROM tether_jobs
WHERE status = 'pending' AND type IN (SELECT value FROM json_each(:types))
GROUP BY type ORDER BY type

-- name: JOBS_COUNTED
-- None on SQLite: the claim pins its index (INDEXED BY), so no statistics can lead it elsewhere.

-- name: ANALYZE_JOBS
-- None on SQLite (JOBS_COUNTED).

-- name: DATABASE_TIME
-- Every process on a SQLite ledger runs on one machine and reads its clock
-- (opening.ledger_clock); this is that clock, in the text form the ledger keeps.
SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')

-- Reconcile (read-only). A check reads its targets in key order a page at a time: a range of
-- tether_targets (one row per target: its latest completed job, kept by the TARGETS_ON_*
-- triggers below), the same cost per target whatever history a target holds, and, in the same
-- read transaction, the targets of that range that a job is in flight on (reconcile/targets.py
-- puts the two together: a target in flight is decided by its first active job).

-- name: RECONCILE_TARGETS
-- Per target after :after_key: its latest completed job's id and type. One range of the
-- table's primary key (WITHOUT ROWID: the row is in the key's b-tree). A page comes as one row
-- (the RECONCILE_TARGETS* all alike): its size, its last key, then a JSON array per column
-- (ids, types, keys, payloads, fingerprints; NULL for a column the statement does not read),
-- the aggregates taking the range's rows in one sequence, so position n of every array is one row.
-- One row rather than a row per target: SQLite makes the whole page in one step, which the
-- driver runs without holding the interpreter's lock, so the check's reader thread reads the
-- next page while the files of this one are looked at (a row per target takes that lock back
-- at every row).
SELECT count(*), max(key), json_group_array(job_id), json_group_array(type), json_group_array(key), NULL, NULL
FROM (SELECT job_id, type, key FROM tether_targets
      WHERE key > :after_key
      ORDER BY key
      LIMIT :limit)

-- name: RECONCILE_TARGETS_PAYLOADS
-- With the payloads of the jobs whose types' probes read them in this mode (:want, a JSON array
-- of type names: catalogue.Statements.types), each read from tether_jobs by id; NULL for the
-- others, whose rows are then never read (a NULL id seeks nothing). A payload larger than
-- :largest bytes (payload_bytes; for a job older than that column, its length) is left NULL
-- too, and read by id apart (reads.py: PAGE_BYTES): a page holds at most :limit times :largest
-- bytes of payloads, however large the files. A join, not a scalar subquery as in
-- RECONCILE_TARGETS_FINGERPRINTS: a subquery opens and closes its cursors on tether_jobs for
-- every row, a good part of a full check's read, where the join holds them open. (Where :want
-- matches no row the subquery costs less: it never opens them.)
SELECT count(*), max(key), json_group_array(job_id), json_group_array(type), json_group_array(key),
       json_group_array(payload), NULL
FROM (SELECT t.job_id, t.type, t.key,
             CASE WHEN coalesce(j.payload_bytes, length(j.payload)) <= :largest THEN j.payload END AS payload
      FROM tether_targets AS t
      LEFT JOIN tether_jobs AS j
        ON j.id = CASE WHEN t.type IN (SELECT value FROM json_each(:want)) THEN t.job_id END
      WHERE t.key > :after_key
      ORDER BY t.key
      LIMIT :limit)

-- name: RECONCILE_TARGETS_FINGERPRINTS
-- RECONCILE_TARGETS_PAYLOADS for a content check by fingerprints: also each target's fingerprint,
-- whatever its type (only the types whose probes check by them record one, and the check looks
-- at no other's: no test of the type a row, a good part of the statement's cost otherwise). The
-- fingerprinted types' payloads are left out of :want (read by id for the few files read), and
-- one larger than :largest is left NULL, as there.
SELECT count(*), max(key), json_group_array(job_id), json_group_array(type), json_group_array(key),
       json_group_array(payload), json_group_array(fingerprint)
FROM (SELECT t.job_id, t.type, t.key,
             CASE WHEN t.type IN (SELECT value FROM json_each(:want))
                  THEN (SELECT CASE WHEN coalesce(j.payload_bytes, length(j.payload)) <= :largest THEN j.payload END
                        FROM tether_jobs AS j WHERE j.id = t.job_id) END AS payload,
             t.fingerprint
      FROM tether_targets AS t
      WHERE t.key > :after_key
      ORDER BY t.key
      LIMIT :limit)

-- name: RECONCILE_IN_FLIGHT
-- The targets in (:after_key, :through] (a page of RECONCILE_TARGETS*) that a job is pending or
-- claimed on, each with its first such job: one range of the (small) index of active targeted
-- jobs. A page's targets without a completed job are among them.
SELECT ordering_key, min(id) FROM tether_jobs INDEXED BY ix_tether_jobs_target_active
WHERE ordering_key IS NOT NULL AND status IN ('pending', 'claimed')
  AND ordering_key > :after_key AND ordering_key <= :through
GROUP BY ordering_key
ORDER BY ordering_key

-- name: RECONCILE_IN_FLIGHT_AFTER
-- RECONCILE_IN_FLIGHT past the last target with a completed job: the targets after :after_key
-- that only in-flight jobs name, :limit at a time.
SELECT ordering_key, min(id) FROM tether_jobs INDEXED BY ix_tether_jobs_target_active
WHERE ordering_key IS NOT NULL AND status IN ('pending', 'claimed') AND ordering_key > :after_key
GROUP BY ordering_key
ORDER BY ordering_key
LIMIT :limit

-- name: RECORD_FINGERPRINTS
-- A content check's new fingerprints of the files it read in sync: :rows is a JSON object
-- {id: fingerprint}; a job no longer completed (purged, say) is left alone.
UPDATE tether_jobs SET fingerprint = r.value
FROM json_each(:rows) AS r
WHERE tether_jobs.id = r.key AND tether_jobs.status = 'completed'

-- name: CLEAN_DIRS
-- The leaf directories under :parent (a walk's prefix: '' for the root's own entries, 'a/' under
-- a) that a check's walk last found without a temp file, each with its fingerprint then
-- (reconcile/clean_dirs.py); the root itself is the row of parent '' and name ''.
SELECT name, fingerprint FROM tether_clean_dirs WHERE parent = :parent

-- name: RECORD_CLEAN_DIRS
-- :rows is a JSON array of [parent, name, fingerprint].
INSERT INTO tether_clean_dirs (parent, name, fingerprint)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]')
FROM json_each(:rows) WHERE true
ON CONFLICT (parent, name) DO UPDATE SET fingerprint = excluded.fingerprint

-- name: FORGET_CLEAN_DIRS
-- :rows is a JSON array of [parent, name]: directories gone, or no longer clean leaves.
DELETE FROM tether_clean_dirs
WHERE (parent, name) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:rows))

-- name: COMMITS_UNSYNCED
-- Backend.transact_unsynced: the connection's next commit does not wait for the disk (in WAL
-- mode NORMAL syncs at checkpoints only). SQLite refuses to change the level inside a
-- transaction, so this runs before it, and COMMITS_SYNCED after it.
PRAGMA synchronous = NORMAL

-- name: COMMITS_SYNCED
-- The level a ledger opened with durability "full" keeps (engine.py's connect-time PRAGMAs).
PRAGMA synchronous = FULL

-- name: WORKER_START
-- A worker process registers itself (ledger/workers.py); its id is unique per process, so a
-- conflict is the same worker starting its loop again.
INSERT INTO tether_workers (id, host, pid, threads, version, started_at, beat_at, stopped_at)
VALUES (:id, :host, :pid, :threads, :version, :now, :now, NULL)
ON CONFLICT (id) DO UPDATE SET threads = excluded.threads, started_at = excluded.started_at,
  beat_at = excluded.beat_at, stopped_at = NULL

-- name: WORKER_BEAT
-- The heartbeat's mark that this worker is alive, in the transaction that renews its locks.
UPDATE tether_workers SET beat_at = :now WHERE id = :id

-- name: WORKER_STOP
UPDATE tether_workers SET beat_at = :now, stopped_at = :now WHERE id = :id

-- name: WORKER_FORGET
-- Workers last heard of before the cutoff (stopped or dead), dropped when another starts, so the
-- table holds the workers of about a day.
DELETE FROM tether_workers WHERE beat_at < :before

-- The targets table (ledger/targets.py): per target, its latest completed job (the highest id
-- among its completed jobs), kept by these triggers on every path that changes one: a
-- completion, a completed job put back or failed (a manual retry, SQL by hand), a purge, a
-- content check's new fingerprint. A job entering the completed state replaces its target's
-- row only if it is newer; the deciding job leaving it (or deleted) has its target's row found
-- again from tether_jobs (back from the end of its entries in ix_tether_jobs_on_target, each
-- row's status read from the table until a completed one: its latest job, most often).
--
-- SQLite runs a row trigger's WHEN inside the trigger's own sub-program, so every row an UPDATE
-- changes calls the sub-program of each trigger whose ``UPDATE OF`` names a column the UPDATE
-- sets, whatever its WHEN then says. One update trigger watches completed_at rather than status:
-- every statement that moves a job into or out of a finished state sets completed_at (a manual
-- retry clears it), while a claim and the transitions between pending and claimed, which never
-- touch a completed job, set status only and call no sub-program (tests/test_targets_table.py
-- walks the catalogue for it). SQL by hand that moves a job into or out of 'completed' sets
-- completed_at with status, as ix_tether_jobs_done asks of it already.

-- name: TARGETS_FUNCTION
-- None on SQLite: a trigger here holds its statements (postgresql.sql's call a function).

-- name: TARGETS_ON_INSERT
CREATE TRIGGER tether_targets_on_insert AFTER INSERT ON tether_jobs
WHEN new.status = 'completed' AND new.ordering_key IS NOT NULL
BEGIN
  INSERT INTO tether_targets (key, job_id, type, fingerprint)
  VALUES (new.ordering_key, new.id, new.type, new.fingerprint)
  ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, type = excluded.type, fingerprint = excluded.fingerprint
  WHERE excluded.job_id >= tether_targets.job_id;
END

-- name: TARGETS_ON_UPDATE
-- A job completed after the update (newly, or with another target, type or fingerprint): its
-- target's row becomes it if it is the newest. A completed job that stops being one or moves to
-- another target: if it decided its old target, that target's latest completed job now takes its
-- place (none: the row goes). Each statement's test on old and new runs before it reads a table.
-- No statement reads tether_targets in a SELECT (the refill's ON CONFLICT rather than NOT
-- EXISTS): SQLite would then copy every INSERT's rows through a temporary table, built on each
-- run, the upsert's of each completion included.
CREATE TRIGGER tether_targets_on_update AFTER UPDATE OF completed_at, ordering_key, type, fingerprint ON tether_jobs
WHEN (old.status = 'completed' AND old.ordering_key IS NOT NULL)
  OR (new.status = 'completed' AND new.ordering_key IS NOT NULL)
BEGIN
  INSERT INTO tether_targets (key, job_id, type, fingerprint)
  SELECT new.ordering_key, new.id, new.type, new.fingerprint
  WHERE new.status = 'completed' AND new.ordering_key IS NOT NULL
  ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, type = excluded.type, fingerprint = excluded.fingerprint
  WHERE excluded.job_id >= tether_targets.job_id;
  DELETE FROM tether_targets
  WHERE old.status = 'completed' AND (new.status <> 'completed' OR new.ordering_key IS NOT old.ordering_key)
    AND key = old.ordering_key AND job_id = old.id;
  INSERT INTO tether_targets (key, job_id, type, fingerprint)
  SELECT ordering_key, id, type, fingerprint FROM tether_jobs
  WHERE old.status = 'completed' AND (new.status <> 'completed' OR new.ordering_key IS NOT old.ordering_key)
    AND ordering_key IS NOT NULL AND ordering_key = old.ordering_key AND status = 'completed'
  ORDER BY id DESC LIMIT 1
  ON CONFLICT (key) DO NOTHING;
END

-- name: TARGETS_ON_DELETE
-- A completed job deleted (a purge): as TARGETS_ON_UPDATE's leaving.
CREATE TRIGGER tether_targets_on_delete AFTER DELETE ON tether_jobs
WHEN old.status = 'completed' AND old.ordering_key IS NOT NULL
BEGIN
  DELETE FROM tether_targets WHERE key = old.ordering_key AND job_id = old.id;
  INSERT INTO tether_targets (key, job_id, type, fingerprint)
  SELECT ordering_key, id, type, fingerprint FROM tether_jobs
  WHERE ordering_key IS NOT NULL AND ordering_key = old.ordering_key AND status = 'completed'
  ORDER BY id DESC LIMIT 1
  ON CONFLICT (key) DO NOTHING;
END

-- name: TARGETS_TRIGGERS
-- The triggers a ledger holds (ensure_schema creates the TARGETS_ON_* it lacks).
SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'tether_jobs'

-- name: TARGETS_CLEAR
DELETE FROM tether_targets

-- name: TARGETS_FILL
-- Every target's latest completed job, into the empty table (a ledger from before it, or one
-- whose triggers were missing): a skip scan of ix_tether_jobs_on_target (one seek per target to
-- its next key, then back from its last entry, each row's status read, to its last completed
-- job), then that job's row by rowid; in key order, so the table is written as an append.
WITH RECURSIVE keys(key) AS (
  SELECT (SELECT ordering_key FROM tether_jobs INDEXED BY ix_tether_jobs_on_target
          WHERE ordering_key IS NOT NULL ORDER BY ordering_key LIMIT 1)
  UNION ALL
  SELECT (SELECT ordering_key FROM tether_jobs INDEXED BY ix_tether_jobs_on_target
          WHERE ordering_key IS NOT NULL AND ordering_key > keys.key ORDER BY ordering_key LIMIT 1)
  FROM keys WHERE keys.key IS NOT NULL
),
latest(rid) AS MATERIALIZED (
  SELECT (SELECT rowid FROM tether_jobs INDEXED BY ix_tether_jobs_on_target
          WHERE ordering_key = keys.key AND status = 'completed' ORDER BY id DESC LIMIT 1)
  FROM keys WHERE keys.key IS NOT NULL
)
INSERT INTO tether_targets (key, job_id, type, fingerprint)
SELECT j.ordering_key, j.id, j.type, j.fingerprint
FROM latest JOIN tether_jobs AS j ON j.rowid = latest.rid
