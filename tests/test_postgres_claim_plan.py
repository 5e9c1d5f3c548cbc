"""The PostgreSQL claim must not get slower with the number of active jobs when jobs have no
ordering key (a regression found by benchmarks/pg_drain.py: tether drained slower with 4 and 8
workers than with 1).

Before the fix, the claim's ``NOT EXISTS (older active job with the same ordering_key)`` was
planned, on a table whose statistics lag (every freshly filled queue), as an anti join reading
every active job once per candidate: 32 candidates x 2,000 active jobs = 64,000 rows per claim,
~30 ms. For a NULL ordering key the answer is known without looking (NULL = NULL is never
true), so ``AND (j.ordering_key IS NULL OR NOT EXISTS (...))`` in sql.py runs the probe only for
keyed jobs, as a correlated probe of ix_tether_jobs_target_active (~1 ms per claim).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import pg_jobtypes  # noqa: E402  (tests/ is on sys.path, as for jobkit)
from tether import Coordinator
from tether.jobtypes import default_registry
from tether.ledger import sql

ACTIVE = 2000
BATCH = 32


@pytest.fixture
def pg_coordinator(pg_database: str, tmp_path: Path) -> Iterator[Coordinator]:
    engine = sa.create_engine(pg_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_jobs")
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_meta")
    engine.dispose()
    registry = default_registry()
    pg_jobtypes.register(registry)
    with Coordinator.open(pg_database, root=tmp_path / "data", registry=registry) as c:
        yield c


def rows_read_from(plan: dict[str, Any], alias: str) -> float:
    """Rows all plan nodes scanning ``alias`` produced, over all their loops."""
    total = 0.0
    if plan.get("Alias") == alias:
        total += plan.get("Actual Rows", 0) * plan.get("Actual Loops", 0)
    for child in plan.get("Plans", []):
        total += rows_read_from(child, alias)
    return total


def test_claiming_jobs_without_ordering_key_reads_no_other_active_job(pg_coordinator: Coordinator) -> None:
    pg_coordinator.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(ACTIVE)])
    params = {"worker": "w", "now": datetime.now(UTC), "limit": BATCH, "max_bytes": 8 << 20}
    with pg_coordinator.engine.connect() as conn:
        with conn.begin() as tx:
            (plan,) = conn.execute(
                sa.text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.claim_sql("postgresql", ["pg_noop"])), params
            ).scalar_one()
            tx.rollback()
    claimed = plan["Plan"]["Actual Rows"]
    assert claimed == BATCH
    # The ordering check reads the table as alias "o"; keyless jobs need none of its rows.
    assert rows_read_from(plan["Plan"], "o") <= BATCH, f"{plan['Execution Time']:.1f} ms"
