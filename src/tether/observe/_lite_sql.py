"""Written by ``python -m tether.observe.compile_lite`` from the statements in ``queries``: do not edit.

``tether status`` on a SQLite file runs these through ``lite`` without loading SQLAlchemy.
"""

from typing import Any

TABLE = 'tether_jobs'

STATEMENTS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    'backlog': (
        'SELECT tether_jobs.type, tether_jobs.status, count(*) AS count_1, min(CASE WHEN (tether_jobs.run_at <= ?) THEN tether_jobs.run_at END) AS min_1, min(tether_jobs.created_at) AS min_2, max(tether_jobs.payload_bytes) AS max_1 \n'
        'FROM tether_jobs \n'
        "WHERE status = 'pending' GROUP BY tether_jobs.type, tether_jobs.status UNION ALL SELECT tether_jobs.type, tether_jobs.status, count(*) AS count_2, min(CASE WHEN (tether_jobs.run_at <= ?) THEN tether_jobs.run_at END) AS min_1, min(tether_jobs.created_at) AS min_3, max(tether_jobs.payload_bytes) AS max_1 \n"
        'FROM tether_jobs \n'
        "WHERE status = 'claimed' GROUP BY tether_jobs.type, tether_jobs.status"
        , (('arg', 'now'), ('arg', 'now')),
    ),
    'failed': (
        'SELECT count(*) AS count_1 \n'
        'FROM tether_jobs \n'
        'WHERE tether_jobs.status = ? AND completed_at IS NOT NULL'
        , (('value', 'failed'),),
    ),
    'stuck': (
        'SELECT count(*) AS count_1 \n'
        'FROM tether_jobs \n'
        'WHERE tether_jobs.status = ? AND tether_jobs.locked_at < ?'
        , (('value', 'claimed'), ('arg', 'cutoff')),
    ),
    'quarantined': (
        'SELECT count(*) AS count_1 \n'
        'FROM tether_jobs \n'
        "WHERE quarantine IS NOT NULL AND status IN ('pending', 'claimed')"
        , (),
    ),
    'deepest': (
        'SELECT tether_jobs.ordering_key, count(*) AS n \n'
        'FROM tether_jobs \n'
        "WHERE status IN ('pending', 'claimed') AND ordering_key IS NOT NULL GROUP BY tether_jobs.ordering_key ORDER BY n DESC, tether_jobs.ordering_key\n"
        ' LIMIT ? OFFSET ?'
        , (('value', 1), ('value', 0)),
    ),
    'finished': (
        'SELECT tether_jobs.status, count(*) AS count_1 \n'
        'FROM tether_jobs \n'
        'WHERE tether_jobs.status IN (?, ?) AND tether_jobs.completed_at >= ? AND tether_jobs.completed_at <= ? GROUP BY tether_jobs.status'
        , (('value', 'completed'), ('value', 'failed'), ('arg', 'since'), ('arg', 'now')),
    ),
    'run_times': (
        'SELECT tether_jobs.type, (julianday(tether_jobs.completed_at) - julianday(tether_jobs.claimed_at)) * ? AS anon_1 \n'
        'FROM tether_jobs \n'
        'WHERE tether_jobs.status = ? AND tether_jobs.completed_at >= ? AND tether_jobs.claimed_at IS NOT NULL'
        , (('value', 86400.0), ('value', 'completed'), ('arg', 'since')),
    ),
}
