"""The PostgreSQL claim must not get slower with the number of active jobs when jobs have no
ordering key (a regression found by benchmarks/pg_drain.py: tether drained slower with 4 and 8
workers than with 1).

Before the fix, the claim's ``NOT EXISTS (older active job with the same ordering_key)`` was
planned, on a table whose statistics lag (every freshly filled queue), as an anti join reading
every active job once per candidate: 32 candidates x 2,000 active jobs = 64,000 rows per claim,
~30 ms. For a NULL ordering key the answer is known without looking (NULL = NULL is never
true), so ``AND (j.ordering_key IS NULL OR NOT EXISTS (...))`` in the claim
(statements/postgresql.sql) runs the probe only for keyed jobs, as a correlated probe of
ix_tether_jobs_target_active (~1 ms per claim).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import pg_jobtypes  # noqa: E402  (tests/ is on sys.path, as for jobkit)
from tether import Coordinator
from tether.jobtypes import default_registry
from tether.ledger.catalogue import POSTGRESQL

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
    params = {"worker": "w", "now": datetime.now(UTC), "limit": BATCH, "max_bytes": 8 << 20, "types": ["pg_noop"]}
    plan = explain(pg_coordinator, POSTGRESQL.CLAIM, params)
    claimed = plan["Plan"]["Actual Rows"]
    assert claimed == BATCH
    # The ordering check reads the table as alias "o"; keyless jobs need none of its rows.
    assert rows_read_from(plan["Plan"], "o") <= BATCH, f"{plan['Execution Time']:.1f} ms"


WAITING = 10_000


def scans_of(plan: dict[str, Any], alias: str) -> list[dict[str, Any]]:
    """The plan nodes that read the table as ``alias``."""
    found = [plan] if plan.get("Alias") == alias else []
    for child in plan.get("Plans", []):
        found += scans_of(child, alias)
    return found


def explain(c: Coordinator, statement: str, params: dict[str, Any], *, analyze: bool = True) -> dict[str, Any]:
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    with c.engine.connect() as conn:
        with conn.begin() as tx:
            driver: Any = conn.connection.driver_connection
            cur = driver.cursor()  # the statement as the driver runs it
            cur.execute(f"EXPLAIN ({options}) " + statement, params)
            ((plan,),) = cur.fetchall()[0]
            tx.rollback()
    return dict(plan)


def rows_touched(plan: dict[str, Any], alias: str) -> float:
    """Rows all plan nodes scanning ``alias`` read, those their filters dropped included."""
    total = 0.0
    if plan.get("Alias") == alias:
        read = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        total += read * plan.get("Actual Loops", 0)
    for child in plan.get("Plans", []):
        total += rows_touched(child, alias)
    return total


@pytest.mark.parametrize("statistics", ["lagging", "stale"])
def test_claiming_behind_a_target_with_10000_waiting_jobs_reads_only_its_head(
    pg_coordinator: Coordinator, statistics: str
) -> None:
    from jobkit import Note, NoteType

    pg_coordinator.registry.register(NoteType())
    finished = WAITING if statistics == "stale" else 0
    notes = [Note(name=f"{i}", target="file:hot") for i in range(finished + WAITING + 1)]
    # Enqueued below the bulk size, which gathers statistics: here they lag, as after many small enqueues.
    jobs = [job for at in range(0, len(notes), 500) for job in pg_coordinator.enqueue_many(notes[at : at + 500])]
    pg_coordinator.enqueue(Note(name="plain"))
    if statistics == "stale":
        # Analyzed while every job was waiting; then the first 10,000 finished (a drain between two
        # automatic ANALYZEs): the statistics still call the finished jobs active.
        with pg_coordinator.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE tether_jobs SET (autovacuum_enabled = false)")
            conn.exec_driver_sql("ANALYZE tether_jobs")
            done = {"ids": [j.id for j in jobs[:finished]], "head": jobs[finished].id}
            conn.execute(sa.text("UPDATE tether_jobs SET status = 'completed' WHERE id = ANY(:ids)"), done)
            conn.execute(sa.text("UPDATE tether_jobs SET blocked = false WHERE id = :head"), done)
    params = {"worker": "w", "now": datetime.now(UTC), "limit": 100, "max_bytes": 8 << 20, "types": ["note"]}
    plan = explain(pg_coordinator, POSTGRESQL.CLAIM, params)
    assert plan["Plan"]["Actual Rows"] == 2  # the target's head and the job without a target
    [walk] = scans_of(plan["Plan"], "j")
    assert index_of(walk) == "ix_tether_jobs_queue", walk  # its part of jobs no older job holds back
    assert rows_touched(plan["Plan"], "j") <= 2, f"{plan['Execution Time']:.1f} ms"
    # The head is asked whether it is its target's oldest active job through that target's entries.
    [probe] = scans_of(plan["Plan"], "o")
    assert index_of(probe) == "ix_tether_jobs_target_active", probe
    assert rows_touched(plan["Plan"], "o") <= 1, probe


def index_of(node: dict[str, Any]) -> str | None:
    """The index a scan node reads (a bitmap heap scan's through its bitmap index scan)."""
    if "Index Name" in node:
        return str(node["Index Name"])
    names = {str(c["Index Name"]) for c in node.get("Plans", []) if c.get("Node Type") == "Bitmap Index Scan"}
    return names.pop() if len(names) == 1 else None


def test_marking_and_unmarking_blocked_jobs_read_one_active_job_of_their_target(pg_coordinator: Coordinator) -> None:
    from jobkit import Note, NoteType

    pg_coordinator.registry.register(NoteType())
    jobs = pg_coordinator.enqueue_many([Note(name=f"{i}", target="file:hot") for i in range(2 * WAITING)])
    with pg_coordinator.engine.begin() as conn:  # stale statistics, as in the claim's test above
        conn.exec_driver_sql("ALTER TABLE tether_jobs SET (autovacuum_enabled = false)")
        conn.exec_driver_sql("ANALYZE tether_jobs")
        finished = {"ids": [j.id for j in jobs[:WAITING]]}
        conn.execute(sa.text("UPDATE tether_jobs SET status = 'completed' WHERE id = ANY(:ids)"), finished)
    new = pg_coordinator.queue.build(Note(name="new", target="file:hot"))
    values = pg_coordinator.queue.backend.insert_values(new)
    for statement, alias in ((POSTGRESQL.INSERT_ON_TARGET, "b"), (POSTGRESQL.UNBLOCK_NEXT, "n")):
        plan = explain(pg_coordinator, statement, values)
        [probe] = scans_of(plan["Plan"], alias)
        assert index_of(probe) == "ix_tether_jobs_target_active", plan
        assert rows_touched(plan["Plan"], alias) <= 1, probe


QUEUED = 20_000


def test_a_bulk_enqueue_gathers_statistics_so_the_claim_walks_the_queue_index(pg_coordinator: Coordinator) -> None:
    with pg_coordinator.engine.begin() as conn:  # nothing but the enqueue gathers statistics here
        conn.exec_driver_sql("ALTER TABLE tether_jobs SET (autovacuum_enabled = false)")
    pg_coordinator.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(QUEUED)])
    params = {"worker": "w", "now": datetime.now(UTC), "limit": 100, "max_bytes": 8 << 20, "types": ["pg_noop"]}
    plan = explain(pg_coordinator, POSTGRESQL.CLAIM, params)
    # Lagging statistics took the queue for nearly empty: a bitmap scan and a sort of every pending job.
    [walk] = scans_of(plan["Plan"], "j")
    assert walk["Node Type"] == "Index Scan" and index_of(walk) == "ix_tether_jobs_queue", walk
    assert rows_touched(plan["Plan"], "j") <= 100, f"{plan['Execution Time']:.1f} ms"


def test_an_enqueue_below_the_bulk_size_leaves_the_statistics_to_autovacuum(pg_coordinator: Coordinator) -> None:
    counted = "SELECT reltuples FROM pg_class WHERE oid = 'tether_jobs'::regclass"
    with pg_coordinator.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE tether_jobs SET (autovacuum_enabled = false)")
    pg_coordinator.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(999)])
    with pg_coordinator.engine.connect() as conn:
        assert conn.exec_driver_sql(counted).scalar_one() == -1  # never gathered
    pg_coordinator.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(1000)])
    with pg_coordinator.engine.connect() as conn:
        assert conn.exec_driver_sql(counted).scalar_one() == 1999


def test_tethers_connections_run_in_utc_and_compile_no_statement_with_jit(pg_database: str) -> None:
    from tether.ledger.engine import create_engine

    for schema in (None, "elsewhere"):
        engine = create_engine(pg_database, schema=schema, create=False)
        try:
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW jit").scalar_one() == "off"
                assert conn.exec_driver_sql("SHOW timezone").scalar_one() == "UTC"
                driver: Any = conn.connection.driver_connection
                assert driver.info.timezone is UTC  # times read with a fixed offset, not through zoneinfo
                assert conn.exec_driver_sql("SHOW search_path").scalar_one() == (schema or '"$user", public')
        finally:
            engine.dispose()
    own = sa.make_url(pg_database).update_query_dict({"options": "-cjit=on"}).render_as_string(hide_password=False)
    engine = create_engine(own, create=False)
    try:
        with engine.connect() as conn:  # the URL's own options stand
            assert conn.exec_driver_sql("SHOW jit").scalar_one() == "on"
    finally:
        engine.dispose()


@pytest.mark.parametrize("max_running", [None, 5])
def test_a_claim_runs_on_its_generic_plan_and_leaves_the_sessions_choice_alone(
    pg_coordinator: Coordinator, max_running: int | None
) -> None:
    pg_coordinator.registry.get("pg_noop").max_running = max_running  # 5: claimed type by type
    pg_coordinator.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(3)])
    queue = pg_coordinator.queue

    def claim(cur: Any) -> tuple[list[Any], str]:
        answers = queue.claimer.claim_in(cur, "w", datetime.now(UTC), 10, 8 << 20)
        return answers, cur.scalar("SHOW plan_cache_mode")

    # Otherwise the plan cache plans every claim afresh (benchmarks/README.md).
    answers, mode = queue.backend.transact(claim, pipelined=True)  # as Queue.claim runs it
    assert (len(queue.claimer.claimed(queue.backend, answers)), mode) == (3, "force_generic_plan")
    with pg_coordinator.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar_one() == "auto"


def test_the_claims_generic_plan_walks_the_queue_index(pg_coordinator: Coordinator) -> None:
    pg_coordinator.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(QUEUED)])
    order = {"now": 1, "limit": 2, "max_bytes": 3, "worker": 4, "types": 5}
    claim = re.sub(r"%\((\w+)\)s", lambda m: f"${order[m.group(1)]}", POSTGRESQL.CLAIM)
    with pg_coordinator.engine.connect() as conn:
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE claim (timestamptz, int, bigint, text, text[]) AS {claim}")
        ((plan,),) = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim (now(), 100, 8388608, 'w', '{pg_noop}')"
        ).all()
        conn.rollback()
    [walk] = scans_of(plan[0]["Plan"], "j")
    assert walk["Node Type"] == "Index Scan" and index_of(walk) == "ix_tether_jobs_queue", walk
    assert rows_touched(plan[0]["Plan"], "j") <= 100, f"{plan[0]['Execution Time']:.1f} ms"


def test_two_processes_bulk_enqueueing_at_once_both_commit_with_the_statistics(
    pg_coordinator: Coordinator, pg_database: str, tmp_path: Path
) -> None:
    # Each bulk transaction ends with ANALYZE, whose lock the other's ANALYZE waits for: neither
    # may fail or deadlock.
    registry = default_registry()
    pg_jobtypes.register(registry)
    barrier = threading.Barrier(2)
    done: dict[int, int] = {}

    def enqueue(c: Coordinator, n: int) -> None:
        payloads = [pg_jobtypes.PgNoop(n=i) for i in range(1500)]
        barrier.wait()
        done[n] = len(c.enqueue_many(payloads))

    with Coordinator.open(pg_database, root=tmp_path / "data", registry=registry) as other:
        threads = [threading.Thread(target=enqueue, args=(c, n)) for n, c in enumerate((pg_coordinator, other))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert done == {0: 1500, 1: 1500}
    with pg_coordinator.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM tether_jobs").scalar_one() == 3000
        assert (
            conn.exec_driver_sql("SELECT reltuples FROM pg_class WHERE oid = 'tether_jobs'::regclass").scalar_one()
            >= 1500
        )
