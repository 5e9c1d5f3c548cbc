"""The targets table (ledger/targets.py) on both backends: after any sequence of what changes jobs
(enqueues and completions, purges, a content check's new fingerprints, failures and retries,
and SQL by hand that puts a completed job back, fails or deletes it, or inserts completed rows),
it holds exactly each target's latest completed job as ``tether_jobs`` defines it; and a ledger
from before it gets it filled on its first open."""

from __future__ import annotations

import random
import re
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tether import Coordinator, CreateFile, FakeClock
from tether.errors import TetherError
from tether.jobtypes import default_registry
from tether.jobtypes.target import file_key
from tether.ledger import meta
from tether.ledger.catalogue import POSTGRESQL, SQLITE, Statements
from tether.ledger.engine import create_engine
from tether.ledger.ids import new_id
from tether.ledger.schema import jobs
from tether.ledger.targets import RETIRED_TRIGGERS, TRIGGERS, targets
from tether.reconcile.check import reconcile
from tether.reconcile.reads import LedgerReads

PATHS = [f"t/{n}.json" for n in range(4)]


def recomputed(conn: sa.Connection) -> dict[str, tuple[Any, ...]]:
    """Each target's latest completed job (id, type, fingerprint), from ``tether_jobs`` alone."""
    found: dict[str, tuple[Any, ...]] = {}
    query = (
        sa.select(jobs.c.ordering_key, jobs.c.id, jobs.c.type, jobs.c.fingerprint)
        .where(jobs.c.ordering_key.is_not(None), jobs.c.status == "completed")
        .order_by(jobs.c.ordering_key, jobs.c.id)
    )
    for key, job_id, job_type, fingerprint in conn.execute(query):
        found[key] = (job_id, job_type, fingerprint)  # the later id replaces the earlier
    return found


def table(conn: sa.Connection) -> dict[str, tuple[Any, ...]]:
    rows = conn.execute(sa.select(targets.c.key, targets.c.job_id, targets.c.type, targets.c.fingerprint))
    return {key: (job_id, job_type, fingerprint) for key, job_id, job_type, fingerprint in rows}


def assert_kept(c: Coordinator, step: str) -> None:
    with c.engine.connect() as conn:
        assert table(conn) == recomputed(conn), step


def some(c: Coordinator, rng: random.Random, where: str) -> str | None:
    """A random job's id among those ``where`` selects (SQL), or None."""
    with c.engine.connect() as conn:
        ids = sorted(conn.execute(sa.text(f"SELECT id FROM tether_jobs WHERE {where}")).scalars())
    return rng.choice(ids) if ids else None


def by_hand(c: Coordinator, statement: str, **params: Any) -> None:
    with c.engine.begin() as conn:
        conn.execute(sa.text(statement), params)


def insert_completed(c: Coordinator, rng: random.Random) -> str:
    """A completed row inserted as a restore or a bulk load would: an id newer than every other."""
    path = rng.choice(PATHS)
    now = c.clock.now()
    payload = CreateFile(path=path, content=rng.random(), overwrite=True)
    row = {"id": new_id(now), "type": payload.job_type, "payload": payload.to_json().decode(), "status": "completed",
           "priority": 0, "attempts": 1, "max_attempts": 3, "created_at": now, "run_at": now, "claimed_at": now,
           "completed_at": now, "ordering_key": file_key(path), "fingerprint": f"fp-{rng.random()}"}  # fmt: skip
    with c.engine.begin() as conn:
        conn.execute(sa.insert(jobs), [row])
    return f"insert {path}"


def step(c: Coordinator, clock: FakeClock, rng: random.Random) -> str:
    """One random change to the ledger, described."""
    kind = rng.choice(["enqueue", "run", "purge", "fingerprint", "fail", "retry", "put back", "delete", "insert"])
    if kind == "enqueue":
        c.enqueue_many([CreateFile(path=rng.choice(PATHS), content=rng.random(), overwrite=True) for _ in range(3)])
    elif kind == "run":
        c.run_until_idle()
    elif kind == "purge":
        clock.advance(3600)
        c.purge(older_than=timedelta(minutes=30), statuses=("completed", "failed"))
    elif kind == "fingerprint" and (job := some(c, rng, "status = 'completed'")):
        LedgerReads(c.engine, [], ["create_file"]).refresh({job: f"fp-{rng.random()}"})
    elif kind == "fail" and (job := some(c, rng, "status IN ('pending', 'completed')")):
        by_hand(
            c, "UPDATE tether_jobs SET status = 'failed', completed_at = :now WHERE id = :id", id=job, now=c.clock.now()
        )
    elif kind == "retry" and (job := some(c, rng, "status = 'failed'")):
        try:
            c.retry(job)
        except TetherError:  # superseded by a newer job on its target: refused, nothing changed
            pass
    elif kind == "put back" and (job := some(c, rng, "status = 'completed'")):
        by_hand(c, "UPDATE tether_jobs SET status = 'pending', completed_at = NULL WHERE id = :id", id=job)
    elif kind == "delete" and (job := some(c, rng, "status = 'completed'")):
        by_hand(c, "DELETE FROM tether_jobs WHERE id = :id", id=job)
    elif kind == "insert":
        return insert_completed(c, rng)
    return kind


@pytest.mark.parametrize("seed", range(6))
def test_the_table_holds_each_targets_latest_completed_job_after_any_changes(coordinator, clock, seed):
    c, rng = coordinator, random.Random(seed)
    done = []
    for _ in range(40):
        done.append(step(c, clock, rng))
        assert_kept(c, " / ".join(done))
    with c.engine.connect() as conn:
        assert table(conn), "the sequence left no completed job: it proved little"


def test_a_completed_job_whose_target_or_type_is_changed_by_hand_moves_with_it(coordinator):
    c = coordinator
    c.enqueue_many([CreateFile(path=p, content=1) for p in PATHS[:2]])
    c.run_until_idle()
    job = some(c, random.Random(0), f"ordering_key = '{file_key(PATHS[0])}'")
    by_hand(c, "UPDATE tether_jobs SET ordering_key = :key WHERE id = :id", key=file_key(PATHS[3]), id=job)
    assert_kept(c, "target changed")
    by_hand(c, "UPDATE tether_jobs SET type = 'delete_file' WHERE id = :id", id=job)
    assert_kept(c, "type changed")


def drop_targets(conn: sa.Connection) -> None:
    """The targets table and its triggers gone, as from a ledger before schema 13."""
    for name in TRIGGERS:
        conn.exec_driver_sql(f"DROP TRIGGER {name}" + (" ON tether_jobs" if conn.dialect.name != "sqlite" else ""))
    conn.exec_driver_sql("DROP TABLE tether_targets")


def to_schema_12(url: str) -> None:
    """The ledger as tether at schema 12 left it: no targets table, no triggers."""
    engine = create_engine(url)
    with engine.begin() as conn:
        drop_targets(conn)
        conn.exec_driver_sql(f"DELETE FROM tether_meta WHERE key = '{meta.LAYOUT}'")
        conn.exec_driver_sql(f"UPDATE tether_meta SET value = '12' WHERE key = '{meta.VERSION}'")
    engine.dispose()


def test_a_ledger_of_schema_12_gets_the_table_filled_from_its_jobs_and_kept_after(db_url, tmp_path):
    root = tmp_path / "data"
    with Coordinator.open(db_url, root=root, registry=default_registry()) as c:
        c.enqueue_many([CreateFile(path=p, content=n, overwrite=True) for n in range(3) for p in PATHS])
        c.run_until_idle()
        c.enqueue(CreateFile(path=PATHS[0], content=9, overwrite=True))  # in flight: not in the table
    to_schema_12(db_url)
    with Coordinator.open(db_url, root=root, registry=default_registry()) as c:
        with c.engine.connect() as conn:
            assert len(table(conn)) == len(PATHS) and table(conn) == recomputed(conn)
            assert meta.read(conn)[meta.VERSION] == str(meta.SCHEMA_VERSION)
        report = reconcile(c)
        assert report.counts["in_sync"] == len(PATHS) - 1 and report.counts["not_checked"] == 1
        c.run_until_idle()  # the triggers keep it from here
        assert_kept(c, "after the upgrade")


# -- the update trigger wakes on completed_at, never on status alone ------------------------------


def assignments(statement: str) -> dict[str, str] | None:
    """The columns an UPDATE of tether_jobs sets, with their values; None for any other statement."""
    head = re.search(r"^UPDATE tether_jobs(?: AS \w+)?(?: INDEXED BY \w+)?\s+SET\s", statement, re.M)
    if head is None:
        return None
    found, depth, current = [], 0, ""
    for i, ch in enumerate(statement[head.end() :], start=head.end()):
        if depth == 0 and re.match(r"\s(FROM|WHERE|RETURNING)\b", statement[i:]):
            break
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            found.append(current)
            current = ""
        else:
            current += ch
    found.append(current)
    return {a.split("=", 1)[0].strip(): a.split("=", 1)[1].strip() for a in found}


@pytest.mark.parametrize("statements", [SQLITE, POSTGRESQL], ids=["sqlite", "postgresql"])
def test_every_statement_that_sets_status_but_wakes_no_trigger_keeps_its_rows_out_of_completed(
    statements: Statements,
):
    watched = re.search(r"AFTER UPDATE OF ([\w, ]+) ON tether_jobs", statements.TARGETS_ON_UPDATE)
    assert watched is not None
    columns = {c.strip() for c in watched.group(1).split(",")}
    assert "status" not in columns and {"completed_at", "ordering_key", "type", "fingerprint"} <= columns
    quiet = []
    for name, statement in statements.named().items():
        assigned = assignments(statement)
        if assigned is None or "status" not in assigned or columns & assigned.keys():
            continue
        # Then it moves rows to another status than completed, and only rows it found by a status
        # (its own WHERE, or PostgreSQL's claim's candidates) that is never completed.
        assert re.fullmatch(r"'(\w+)'", assigned["status"]) and assigned["status"] != "'completed'", name
        assert re.search(r"(?<!\w)\+?(?:\w+\.)?status = '\w+'", statement), f"{name} names no status it changes"
        assert "'completed'" not in statement, f"{name} may change a completed row"
        quiet.append(name)
    assert {"CLAIM", "RETRY", "RELEASE", "DEFER", "RECLAIM"} <= set(quiet), quiet
    moving = [name for name, s in statements.named().items() if "status" in (assignments(s) or {})]
    assert {"COMPLETE", "COMPLETE_MANY", "FAIL", "CANCEL", "MANUAL_RETRY", "RECLAIM_EXHAUSTED"} <= set(moving)
    for name in set(moving) - set(quiet):  # every other move of a job wakes the trigger, completed_at first
        assert "completed_at" in assignments(getattr(statements, name)), name  # type: ignore[operator]


def test_a_claim_runs_no_trigger_and_a_completion_one_that_builds_no_temporary_table_on_sqlite(tmp_path):
    with Coordinator.open(f"sqlite:///{tmp_path / 'tether.db'}", root=tmp_path / "data") as c:
        with c.engine.connect() as conn:

            def ops(statement: str) -> list[str]:
                program = conn.exec_driver_sql("EXPLAIN " + re.sub(r":(\w+)", "NULL", statement)).all()
                return [op[1] for op in program]

            assert ops(SQLITE.CLAIM).count("Program") == 0
            assert ops(SQLITE.COMPLETE_MANY).count("Program") == 1
            # The trigger's program and the row's own checks (the status CHECK among them) included.
            completion = ops(SQLITE.COMPLETE_NO_RETURN)
            assert completion.count("Program") == 1 and "OpenEphemeral" not in completion


def to_retired_triggers(url: str) -> None:
    """The ledger as schema 14 left it: tether_targets kept by triggers woken by status."""
    engine = create_engine(url)
    pg = engine.dialect.name == "postgresql"
    when = {
        "enter": "NEW.status = 'completed' AND NEW.ordering_key IS NOT NULL AND (OLD.status <> 'completed'"
        " OR OLD.ordering_key IS DISTINCT FROM NEW.ordering_key OR OLD.type <> NEW.type)",
        "leave": "OLD.status = 'completed' AND OLD.ordering_key IS NOT NULL AND (NEW.status <> 'completed'"
        " OR NEW.ordering_key IS DISTINCT FROM OLD.ordering_key OR NEW.type <> OLD.type)",
        "fingerprint": "OLD.status = 'completed' AND NEW.status = 'completed' AND NEW.ordering_key IS NOT NULL",
    }
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER tether_targets_on_update" + (" ON tether_jobs" if pg else ""))
        for what in ("enter", "leave", "fingerprint"):
            columns = "fingerprint" if what == "fingerprint" else "status, ordering_key, type"
            head = f"CREATE TRIGGER tether_targets_on_{what} AFTER UPDATE OF {columns} ON tether_jobs"
            if pg:
                conn.exec_driver_sql(
                    f"{head} FOR EACH ROW WHEN ({when[what]}) EXECUTE FUNCTION tether_keep_targets('{what}')"
                )
            else:  # a body that marks the row, so a trigger left behind shows
                body = "UPDATE tether_targets SET type = 'stale' WHERE key = new.ordering_key"
                conn.exec_driver_sql(
                    f"{head} WHEN {when[what].replace('IS DISTINCT FROM', 'IS NOT')} BEGIN {body}; END"
                )
        conn.exec_driver_sql(f"DELETE FROM tether_meta WHERE key = '{meta.LAYOUT}'")
        conn.exec_driver_sql(f"UPDATE tether_meta SET value = '14' WHERE key = '{meta.VERSION}'")
    engine.dispose()


def test_opening_a_ledger_kept_by_the_retired_triggers_swaps_them_for_the_update_trigger(db_url, tmp_path):
    root = tmp_path / "data"
    with Coordinator.open(db_url, root=root, registry=default_registry()) as c:
        c.enqueue_many([CreateFile(path=p, content=1, overwrite=True) for p in PATHS])
        c.run_until_idle()
    to_retired_triggers(db_url)
    with Coordinator.open(db_url, root=root, registry=default_registry()) as c:
        with c.engine.connect() as conn:
            present = set(conn.exec_driver_sql(c.queue.sql.TARGETS_TRIGGERS).scalars())
            assert present == set(TRIGGERS) and not present & set(RETIRED_TRIGGERS)
            assert meta.read(conn)[meta.VERSION] == str(meta.SCHEMA_VERSION)
        c.enqueue_many([CreateFile(path=p, content=2, overwrite=True) for p in PATHS[:2]])
        c.run_until_idle()
        assert_kept(c, "after the swap")
