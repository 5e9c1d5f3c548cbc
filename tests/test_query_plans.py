"""Every hot statement uses an index: no table scan, no temp B-tree sort (SQLite plans)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from tether import Coordinator
from tether.jobtypes import default_registry
from tether.ledger.catalogue import SQLITE

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PARAMS = {
    "id": "x",
    "type": "create_file",
    "payload": "{}",
    "priority": 0,
    "max_attempts": 3,
    "created_at": NOW,
    "run_at": NOW,
    "idempotency_key": "k",
    "ordering_key": "file:a",
    "parent_id": None,
    "timeout": None,
    "payload_bytes": 2,
    "worker": "w",
    "attempt": 1,
    "now": NOW,
    "limit": 10,
    "max_bytes": 8 << 20,
    "cutoff": NOW,
    "result": None,
    "error": "e",
    "rows": "{}",
    "attempts": 1,
    "quarantine": "q",
    "acquitted": "a",
    "types": '["create_file", "delete_file"]',
    "lock": "l",
    "job_id": "x",
    "started_at": NOW,
    "ended_at": NOW,
    "outcome": "error",
    "ids": '["a", "b"]',
    "reason": "r",
    "snoozed": 1,
    "tag": "tenant:acme",
    "meta": None,
    "retry_of": None,
    "traceparent": None,
}

# Every statement that asks whether an older job on a target is active (the blocked flag, the
# claim's NOT EXISTS) reads only the active jobs of that target.
TARGET = "ix_tether_jobs_target_active"

HOT = {
    "insert": (SQLITE.INSERT, TARGET),
    "insert_on_target": (SQLITE.INSERT_ON_TARGET, TARGET),
    "unblock_next": (SQLITE.UNBLOCK_NEXT, TARGET),
    "any_blocked": (SQLITE.ANY_BLOCKED, "ix_tether_jobs_queue"),
    "active_by_key": (SQLITE.ACTIVE_BY_KEY, ("ux_tether_jobs_key_active", "ix_tether_jobs_key")),
    "get": (SQLITE.GET, "sqlite_autoindex_tether_jobs_1"),
    "payload": (SQLITE.PAYLOAD, "sqlite_autoindex_tether_jobs_1"),
    "claim": (SQLITE.CLAIM, "ix_tether_jobs_queue"),
    "complete": (SQLITE.COMPLETE, "sqlite_autoindex_tether_jobs_1"),
    "retry": (SQLITE.RETRY, "sqlite_autoindex_tether_jobs_1"),
    "fail": (SQLITE.FAIL, "sqlite_autoindex_tether_jobs_1"),
    "release": (SQLITE.RELEASE, "sqlite_autoindex_tether_jobs_1"),
    "defer": (SQLITE.DEFER, "sqlite_autoindex_tether_jobs_1"),
    "heartbeat": (SQLITE.HEARTBEAT, "sqlite_autoindex_tether_jobs_1"),
    "complete_no_return": (SQLITE.COMPLETE_NO_RETURN, "sqlite_autoindex_tether_jobs_1"),
    "retry_no_return": (SQLITE.RETRY_NO_RETURN, "sqlite_autoindex_tether_jobs_1"),
    "fail_no_return": (SQLITE.FAIL_NO_RETURN, "sqlite_autoindex_tether_jobs_1"),
    "release_no_return": (SQLITE.RELEASE_NO_RETURN, "sqlite_autoindex_tether_jobs_1"),
    "defer_no_return": (SQLITE.DEFER_NO_RETURN, "sqlite_autoindex_tether_jobs_1"),
    "manual_retry": (SQLITE.MANUAL_RETRY, ("sqlite_autoindex_tether_jobs_1", TARGET)),
    "newer_on_target": (SQLITE.NEWER_ON_TARGET, "ix_tether_jobs_on_target"),
    "retried_as": (SQLITE.RETRIED_AS, "ix_tether_jobs_retry_of"),
    "note_of": (SQLITE.NOTE_OF, ("sqlite_autoindex_tether_jobs_1", "ix_tether_job_tags_job")),
    "tag": (SQLITE.TAG, None),
    "note": (SQLITE.NOTE, "sqlite_autoindex_tether_jobs_1"),
    "stale": (SQLITE.STALE, "ix_tether_jobs_claimed_lock"),
    "reclaim": (SQLITE.RECLAIM, "sqlite_autoindex_tether_jobs_1"),
    "reclaim_exhausted": (SQLITE.RECLAIM_EXHAUSTED, "sqlite_autoindex_tether_jobs_1"),
    "acquit": (SQLITE.ACQUIT, "ix_tether_jobs_quarantined"),
    "complete_many": (SQLITE.COMPLETE_MANY, "sqlite_autoindex_tether_jobs_1"),
    # an operator's cancel by id; a worker's read of the requests for the jobs it holds, through
    # the partial index of exactly those rows
    "cancel": (SQLITE.CANCEL, "sqlite_autoindex_tether_jobs_1"),
    "cancel_running": (SQLITE.CANCEL_RUNNING, "sqlite_autoindex_tether_jobs_1"),
    "cancel_running_no_return": (SQLITE.CANCEL_RUNNING_NO_RETURN, "sqlite_autoindex_tether_jobs_1"),
    "request_cancel": (SQLITE.REQUEST_CANCEL, "sqlite_autoindex_tether_jobs_1"),
    "cancel_requests": (SQLITE.CANCEL_REQUESTS, "ix_tether_jobs_cancel_requested"),
    "insert_payloads": (SQLITE.INSERT_PAYLOADS, None),
    "insert_attempt": (SQLITE.INSERT_ATTEMPT, None),
    "attempt_trace": (SQLITE.ATTEMPT_TRACE, "ix_tether_attempts_job"),
    "insert_targeted": (SQLITE.INSERT_TARGETED, TARGET),
    # the sweep's safety net, and the upgrade of a ledger from before the flag: every active job
    # with a target once, through their partial index (SQLite: SEARCH ... (ordering_key>?))
    "lost_heads": (SQLITE.LOST_HEADS, TARGET),
    # a worker's unserved check at its start and when it runs out of work: the head of the queue,
    # as many entries as its LIMIT, however many jobs wait
    "waiting_types": (SQLITE.WAITING_TYPES, "ix_tether_jobs_queue"),
    "unblock_head": (SQLITE.UNBLOCK_HEAD, TARGET),
    "block_waiting": (SQLITE.BLOCK_WAITING, TARGET),
}


# The claim reads the part of the pending jobs' index that is not blocked (blocked=?) in its
# ORDER BY and stops at LIMIT: it reads no finished, claimed, blocked or (beyond LIMIT) waiting
# row. So does its probe of the first ready job (h: is it quarantined?), which stops at the first.

# The claim's one-row CTE (its first ready job), materialised once and read twice.
ONE_ROW = {"SCAN first"}
# Statements that take their rows as JSON walk that JSON (json_each), never the table.
JSON_WALKS = ("SCAN r VIRTUAL TABLE", "SCAN json_each VIRTUAL TABLE")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans")
    c = Coordinator.open(f"sqlite:///{path / 'plans.db'}", root=path / "data", registry=default_registry())
    # Enough rows in every status for the planner's statistics to matter.
    with c.engine.begin() as conn:
        for i in range(2000):
            status = ["pending", "claimed", "completed", "failed"][i % 4]
            values = {**PARAMS, "id": f"{i:026d}", "idempotency_key": f"k{i}" if i % 3 else None}
            conn.exec_driver_sql(SQLITE.INSERT, numbered({**values, "ordering_key": f"file:{i % 50}"}))
            conn.execute(sa.text("UPDATE tether_jobs SET status = :s WHERE id = :id"), {"s": status, "id": f"{i:026d}"})
        conn.exec_driver_sql("ANALYZE")
    yield c.engine
    c.close()


# The values of the inserts, which number their parameters (?1 to ?13), in that order; an insert
# takes the first as many as it numbers.
INSERT_ORDER = (
    "id",
    "type",
    "payload",
    "priority",
    "max_attempts",
    "created_at",
    "run_at",
    "parent_id",
    "timeout",
    "payload_bytes",
    "traceparent",
    "ordering_key",
    "idempotency_key",
)


def numbered(params: dict, statement: str = SQLITE.INSERT) -> tuple:
    from tether.ledger.sqlitetime import to_text

    count = max(int(n) for n in re.findall(r"\?(\d+)", statement))
    return tuple(to_text(v) if isinstance(v, datetime) else v for v in (params[n] for n in INSERT_ORDER[:count]))


def plan(engine: sa.Engine, statement: str) -> list[str]:
    from tether.ledger import drivers

    params = numbered(PARAMS, statement) if "?1" in statement else drivers.for_engine(engine).bind(PARAMS)
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None
        return [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + statement, params)]


@pytest.mark.parametrize("name", sorted(HOT))
def test_hot_statement_neither_scans_nor_sorts(engine, name):
    statement, index = HOT[name]
    steps = plan(engine, statement)
    scans = [
        s
        for s in steps
        if s.startswith("SCAN") and "CONSTANT ROW" not in s and s not in ONE_ROW and not s.startswith(JSON_WALKS)
    ]
    assert not scans, f"{name} scans: {steps}"
    assert not [s for s in steps if "TEMP B-TREE" in s], f"{name} sorts: {steps}"
    if index:
        names = (index,) if isinstance(index, str) else index
        assert any(n in s for s in steps for n in names), f"{name} does not use {index}: {steps}"


def test_claim_updates_the_chosen_jobs_by_primary_key(engine):
    steps = plan(engine, SQLITE.CLAIM)
    assert steps[0] == "SEARCH tether_jobs USING INDEX sqlite_autoindex_tether_jobs_1 (id=?)", steps


def test_claim_checks_older_jobs_on_the_target_through_the_active_target_index(engine):
    steps = plan(engine, SQLITE.CLAIM)
    assert any("ix_tether_jobs_target_active" in s for s in steps), steps


def test_claim_index_holds_pending_jobs_in_the_claim_order_blocked_ones_apart():
    from tether.ledger.schema import jobs

    [index] = [i for i in jobs.indexes if i.name == "ix_tether_jobs_queue"]
    ddl = str(sa.schema.CreateIndex(index).compile(dialect=sqlite.dialect()))
    assert "(blocked, priority DESC, created_at, id) WHERE status = 'pending'" in ddl
    assert "ORDER BY j.priority DESC, j.created_at, j.id" in SQLITE.CLAIM


def test_claim_reads_only_the_jobs_no_older_job_on_their_target_holds_back(engine):
    steps = plan(engine, SQLITE.CLAIM)
    walks = [s for s in steps if "ix_tether_jobs_queue" in s]
    assert walks == [
        "SEARCH h USING INDEX ix_tether_jobs_queue (blocked=?)",
        "SEARCH j USING INDEX ix_tether_jobs_queue (blocked=?)",
    ], steps
