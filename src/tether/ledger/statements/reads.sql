-- Reconcile's reads that run through SQLAlchemy (``sa.text``) on either database, in short
-- read-only transactions of their own: ``:name`` placeholders, which SQLAlchemy turns into the
-- driver's, and ``IN :keys`` lists the caller binds as expanding parameters. Loaded by name
-- into ``catalogue.READS`` (catalogue.py); the SQLite plans are checked in
-- tests/test_reconcile_scale.py.

-- name: PAYLOADS_BY_ID
-- Payloads of the latest completed jobs a check reads by id (by primary key): the files a check
-- by fingerprints reads, the few targets an existence check disagreed on.
SELECT id, payload FROM tether_jobs WHERE id IN :ids

-- name: PAYLOAD_SIZES_BY_ID
-- Their sizes first, to read the payloads in parts of bounded bytes (a job older than
-- payload_bytes: its length in characters, near enough for a bound), in the order of the ids.
SELECT id, coalesce(payload_bytes, length(payload)) FROM tether_jobs WHERE id IN :ids ORDER BY id

-- name: RECONCILE_RECHECK
-- Asked again after the disk was read, for targets that disagreed: the latest completed job and
-- whether one is active now, per target that has a completed job now (one without is absent,
-- which the check takes for a change). The target's row of tether_targets and its range of the
-- index of active targeted jobs, never its history.
SELECT t.key, t.job_id,
       CASE WHEN EXISTS (SELECT 1 FROM tether_jobs AS a
                         WHERE a.ordering_key = t.key AND a.status IN ('pending', 'claimed')) THEN 1 ELSE 0 END
FROM tether_targets AS t WHERE t.key IN :keys

-- name: ACTIVE_ON_TARGET
SELECT 1 FROM tether_jobs WHERE ordering_key = :key AND status IN ('pending', 'claimed') LIMIT 1

-- name: KNOWN_TARGETS
SELECT DISTINCT ordering_key FROM tether_jobs WHERE ordering_key IN :keys

-- name: COUNT_TARGETS
-- The targets a check streams (a progress bar's total): those a completed job names (the rows
-- of tether_targets) and those only in-flight jobs name (from the small index of active
-- targeted jobs, each looked up in tether_targets).
SELECT (SELECT count(*) FROM tether_targets)
     + (SELECT count(DISTINCT a.ordering_key) FROM tether_jobs AS a
        WHERE a.ordering_key IS NOT NULL AND a.status IN ('pending', 'claimed')
          AND NOT EXISTS (SELECT 1 FROM tether_targets AS t WHERE t.key = a.ordering_key))

-- name: TYPE_TARGETED
-- Whether a job type has ever had a job on a target (reconcile's search for untracked remote
-- resources); an index-only read of ix_tether_jobs_on_target, which holds the type.
SELECT 1 FROM tether_jobs WHERE ordering_key IS NOT NULL AND type = :type LIMIT 1
