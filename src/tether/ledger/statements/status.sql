-- Written by ``python -m tether.observe.compile_lite`` from the statements in observe/health.py, compiled
-- for SQLite: do not edit. ``tether status`` on a SQLite file runs these through observe/lite.py
-- without loading SQLAlchemy; :now, :cutoff, :since are the times it binds.

-- name: backlog
SELECT tether_jobs.type, tether_jobs.status, count(*) AS count_1, min(CASE WHEN (tether_jobs.run_at <= :now) THEN tether_jobs.run_at END) AS min_1, min(tether_jobs.created_at) AS min_2, max(tether_jobs.payload_bytes) AS max_1, count(CASE WHEN (tether_jobs.status = 'pending' AND tether_jobs.run_at > :now AND tether_jobs.attempts = 0) THEN 1 END) AS count_2, count(CASE WHEN (tether_jobs.status = 'pending' AND tether_jobs.run_at > :now AND tether_jobs.attempts > 0) THEN 1 END) AS count_3
FROM tether_jobs
WHERE status = 'pending' GROUP BY tether_jobs.type, tether_jobs.status UNION ALL SELECT tether_jobs.type, tether_jobs.status, count(*) AS count_4, min(CASE WHEN (tether_jobs.run_at <= :now) THEN tether_jobs.run_at END) AS min_1, min(tether_jobs.created_at) AS min_3, max(tether_jobs.payload_bytes) AS max_1, count(CASE WHEN (tether_jobs.status = 'pending' AND tether_jobs.run_at > :now AND tether_jobs.attempts = 0) THEN 1 END) AS count_2, count(CASE WHEN (tether_jobs.status = 'pending' AND tether_jobs.run_at > :now AND tether_jobs.attempts > 0) THEN 1 END) AS count_3
FROM tether_jobs
WHERE status = 'claimed' GROUP BY tether_jobs.type, tether_jobs.status

-- name: failed
SELECT count(*) AS count_1
FROM tether_jobs
WHERE tether_jobs.status = 'failed' AND completed_at IS NOT NULL

-- name: stuck
SELECT count(*) AS count_1
FROM tether_jobs
WHERE tether_jobs.status = 'claimed' AND tether_jobs.locked_at < :cutoff

-- name: quarantined
SELECT count(*) AS count_1
FROM tether_jobs
WHERE quarantine IS NOT NULL AND status IN ('pending', 'claimed')

-- name: deepest
SELECT ordering_key, count(*) AS n
FROM tether_jobs INDEXED BY ix_tether_jobs_target_active
WHERE status IN ('pending', 'claimed') AND ordering_key IS NOT NULL GROUP BY ordering_key ORDER BY n DESC, ordering_key
 LIMIT 1 OFFSET 0

-- name: paused
SELECT tether_paused.job_type, tether_paused.paused_at, tether_paused.reason
FROM tether_paused ORDER BY tether_paused.job_type

-- name: finished
SELECT tether_jobs.status, count(*) AS count_1
FROM tether_jobs
WHERE tether_jobs.status IN ('completed', 'failed') AND tether_jobs.completed_at >= :since AND tether_jobs.completed_at <= :now GROUP BY tether_jobs.status

-- name: run_times
SELECT tether_jobs.type, (julianday(tether_jobs.completed_at) - julianday(tether_jobs.claimed_at)) * 86400.0 AS anon_1
FROM tether_jobs
WHERE tether_jobs.status = 'completed' AND tether_jobs.completed_at >= :since AND tether_jobs.claimed_at IS NOT NULL
