"""On PostgreSQL too, a scrape reads through indexes, never the whole table: every statement the
collector runs, captured as it runs and explained with its own parameters, on a ledger mostly of
finished jobs (as one in service is) with fresh statistics."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tether import Coordinator
from tether.observe import metrics

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FINISHED = 50_000


@pytest.fixture
def pg_ledger(pg_database: str, tmp_path: Path) -> Iterator[Coordinator]:
    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_jobs")
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_reconcile_runs")
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_meta")
    engine.dispose()
    with Coordinator.open(pg_database, root=tmp_path / "data") as c:
        with c.engine.begin() as conn:
            # One job a second for the last FINISHED seconds, 1 in 100 failed; 200 pending, 5 claimed.
            conn.execute(
                sa.text("""
                INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                                         created_at, run_at, claimed_at, completed_at, locked_at, locked_by)
                SELECT lpad(n::text, 26, '0'), 'create_file', '{}',
                       CASE WHEN n > :finished + 200 THEN 'claimed' WHEN n > :finished THEN 'pending'
                            WHEN n % 100 = 0 THEN 'failed' ELSE 'completed' END,
                       0, 1, 3, t, t,
                       CASE WHEN n > :finished AND n <= :finished + 200 THEN NULL ELSE t END,
                       CASE WHEN n > :finished THEN NULL ELSE t + interval '1 second' END,
                       CASE WHEN n > :finished + 200 THEN t END,
                       CASE WHEN n > :finished + 200 THEN 'w' END
                FROM generate_series(1, :finished + 205) AS n,
                     LATERAL (SELECT CAST(:now AS timestamptz) - (:finished + 205 - n) * interval '1 second') AS s(t)
                """),
                {"finished": FINISHED, "now": NOW},
            )
        with c.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE tether_jobs")
        yield c


def scans(plan: dict[str, Any]) -> Iterator[tuple[str, str]]:
    yield plan["Node Type"], plan.get("Relation Name", "")
    for child in plan.get("Plans", []):
        yield from scans(child)


def test_a_scrape_reads_through_indexes_on_postgresql(pg_ledger: Coordinator) -> None:
    statements: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "tether_" in statement:
            statements.append((statement, parameters))

    collector = metrics.LedgerCollector(pg_ledger, since=NOW - timedelta(seconds=100), settle=timedelta(0))
    sa.event.listen(pg_ledger.engine, "before_cursor_execute", capture)
    try:
        list(collector.collect())
    finally:
        sa.event.remove(pg_ledger.engine, "before_cursor_execute", capture)
    assert len(statements) >= 5, statements
    used = set()
    with pg_ledger.engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        cursor = driver.cursor()
        for statement, parameters in statements:
            cursor.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
            (plan,) = cursor.fetchone()[0]
            nodes = list(scans(plan["Plan"]))
            assert ("Seq Scan", "tether_jobs") not in nodes, f"reads every row: {nodes}\n{statement}"
            used.update(nodes)
    assert any(node.startswith(("Index", "Bitmap")) for node, _ in used), used
