"""Every operator question reads through an index, never the whole table (SQLite plans).

The statements are the ones the observe and retention functions really execute, captured as
they run, then explained with their own parameters: on a ledger without statistics (as tether
leaves it) and after ANALYZE (as an operator may leave it). ``counts`` and ``duplicates`` say in
their docstrings that they read every row, and are not asked here.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tether import Coordinator
from tether.jobtypes import default_registry
from tether.observe import durations, finished, health, jobs, metrics, pages, retention, stuck, tags

NOW = datetime(2026, 1, 1, tzinfo=UTC)
STATUSES = ["pending", "claimed", "completed", "completed", "completed", "failed"]

# Walks that read only the backlog: partial indexes of pending, of claimed and of failed jobs;
# the newest of the few reconcile verdicts kept, by its primary key; and the paused types (a row
# for each type an operator paused), by theirs.
BACKLOG_WALKS = (
    "USING INDEX ix_tether_jobs_queue",
    "USING INDEX ix_tether_jobs_claimed_lock",
    "USING INDEX ix_tether_jobs_failed",
    "SCAN tether_reconcile_runs USING INDEX sqlite_autoindex_tether_reconcile_runs_1",
    "SCAN tether_paused USING INDEX sqlite_autoindex_tether_paused_1",
)
# Listings of finished jobs, newest first: each walks its window in order and stops at the limit.
NEWEST_FINISHED = ("failed", "failed since", "recent", "jobs completed", "jobs failed")


def _two_pages(c: Coordinator, where: pages.JobFilter) -> None:
    for oldest_first in (False, True):
        first = pages.jobs_page(c, where, limit=5, oldest_first=oldest_first)
        if first.after is not None:
            pages.jobs_page(c, where, after=first.after, limit=5, oldest_first=oldest_first)


# The newest (or oldest) jobs of the whole ledger: the primary key walked in its own order and
# stopped by LIMIT after one page, so it reads a page of rows, not the table.
ORDERED_WALKS = {"jobs page all": "SCAN tether_jobs USING INDEX sqlite_autoindex_tether_jobs_1"}

QUESTIONS: dict[str, Callable[[Coordinator], Any]] = {
    "stats": lambda c: health.stats(c, now=NOW),
    "failed": lambda c: finished.failed(c),
    "failed since": lambda c: finished.failed(c, since=NOW - timedelta(seconds=100)),
    "stuck": lambda c: stuck.stuck(c, now=NOW),
    "durations": lambda c: durations.durations(c, now=NOW),
    "recent": lambda c: finished.recent(c, now=NOW),
    **{f"jobs {s}": partial(jobs.jobs, status=s) for s in ("pending", "claimed", "completed", "failed")},
    "jobs completed since": lambda c: jobs.jobs(c, status="completed", since=NOW - timedelta(seconds=100)),
    "metrics scrape": lambda c: list(
        metrics.LedgerCollector(c, since=NOW - timedelta(seconds=100), settle=timedelta(0)).collect()
    ),
    # the web page's listing: one keyset page, and the page after it, per driving index
    **{
        f"jobs page {name}": partial(_two_pages, where=where)
        for name, where in {
            "all": pages.JobFilter(),
            "pending": pages.JobFilter(status="pending"),
            "claimed": pages.JobFilter(status="claimed"),
            "completed": pages.JobFilter(status="completed"),
            "failed of a type": pages.JobFilter(status="failed", job_type="create_file"),
            "target": pages.JobFilter(target="file:7"),
            "key": pages.JobFilter(job_type="create_file", key="k7"),
            "window": pages.JobFilter(since=NOW - timedelta(seconds=100)),
            "completed window": pages.JobFilter(status="completed", since=NOW - timedelta(seconds=100)),
            "tag": pages.JobFilter(tag="tenant:1"),
            "failed of a tag": pages.JobFilter(status="failed", tag="tenant:1"),
        }.items()
    },
    "jobs of a tag": lambda c: jobs.jobs(c, tag="tenant:1"),
    "failed of a tag": lambda c: tags.tagged_jobs(
        c, "tenant:1", statuses=["failed"], since=NOW - timedelta(1), finished_since=NOW - timedelta(seconds=100)
    ),
    "ids of a tag": lambda c: tags.job_ids_tagged(c, "tenant:1", statuses=["pending", "claimed"]),
    "notes": lambda c: tags.notes(c, [f"{i:026d}" for i in range(0, 3000, 300)]),
    "failed by error": lambda c: finished.failed_by_error(c),
    "on target": lambda c: jobs.on_target(c, "file:7"),
    "purge dry run": lambda c: retention.purge(c, older_than=timedelta(seconds=1000), dry_run=True, now=NOW),
    "purge": lambda c: retention.purge(
        c, older_than=timedelta(seconds=1000), statuses=("completed", "failed"), batch_size=100, now=NOW
    ),
}


def _fill(path: Path, analyzed: bool) -> None:
    """A ledger of 3,000 jobs at ``path``, with statistics when ``analyzed``."""
    c = Coordinator.open(f"sqlite:///{path / 'plans.db'}", root=path / "data", registry=default_registry())
    with c.engine.begin() as conn:
        for i in range(3000):  # mostly finished, as a ledger in service is
            status = STATUSES[i % len(STATUSES)]
            at = (NOW - timedelta(seconds=3000 - i)).strftime("%Y-%m-%d %H:%M:%S.%f")
            finished = at if status in ("completed", "failed") else None
            conn.exec_driver_sql(
                "INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts, created_at,"
                " run_at, claimed_at, completed_at, locked_at, locked_by, ordering_key, idempotency_key)"
                " VALUES (?, 'create_file', '{}', ?, 0, 1, 3, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    f"{i:026d}",
                    status,
                    at,
                    at,
                    None if status == "pending" else at,
                    finished,
                    at if status == "claimed" else None,
                    "w" if status == "claimed" else None,
                    f"file:{i % 50}" if i % 2 else None,
                    f"k{i % 40}" if i % 6 == 3 else None,  # completed jobs: a key may repeat
                ),
            )
            if i % 2 == 0:  # half the jobs carry a tag, of three tenants (as a ledger that uses tags)
                conn.exec_driver_sql(
                    "INSERT INTO tether_job_tags (tag, job_id) VALUES (?, ?)", (f"tenant:{i % 3}", f"{i:026d}")
                )
        if analyzed:
            conn.exec_driver_sql("ANALYZE")
    c.close()


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The filled ledger of each kind, made once per module: every test gets a copy of its own."""
    made: dict[str, Path] = {}

    def of(kind: str) -> Path:
        if kind not in made:
            made[kind] = tmp_path_factory.mktemp("plans")
            _fill(made[kind], analyzed=kind == "analyzed")
        return made[kind]

    return of


@pytest.fixture(params=["no statistics", "analyzed"])
def ledger(request, tmp_path, filled):
    """A copy of the filled ledger (a purge among the questions deletes rows); its data root is
    the template's, which no question reads."""
    made = filled(request.param)
    for name in ("plans.db", "plans.db-wal"):
        if (made / name).exists():
            shutil.copyfile(made / name, tmp_path / name)
    c = Coordinator.open(f"sqlite:///{tmp_path / 'plans.db'}", registry=default_registry())
    yield c
    c.close()


def executed(c: Coordinator, question: Callable[[Coordinator], Any]) -> list[tuple[str, Any]]:
    statements: list[tuple[str, Any]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith(("SELECT", "DELETE", "UPDATE")):
            statements.append((statement, parameters))

    sa.event.listen(c.engine, "before_cursor_execute", capture)
    try:
        question(c)
    finally:
        sa.event.remove(c.engine, "before_cursor_execute", capture)
    return statements


@pytest.mark.parametrize("name", sorted(QUESTIONS))
def test_an_operator_question_reads_through_an_index(ledger, name):
    statements = executed(ledger, QUESTIONS[name])
    assert statements, f"{name} ran no statement"
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        for statement, parameters in statements:
            steps = [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + statement, parameters)]
            walks = [s for s in steps if s.startswith("SCAN") and not s.endswith(BACKLOG_WALKS)]
            if "LIMIT" in statement and name in ORDERED_WALKS:
                walks = [s for s in walks if s != ORDERED_WALKS[name]]
            assert not walks, f"{name} reads more than its index range: {steps}\n{statement}"


@pytest.mark.parametrize("name", NEWEST_FINISHED)
def test_a_listing_of_finished_jobs_never_sorts_its_whole_window(ledger, name):
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        for statement, parameters in executed(ledger, QUESTIONS[name]):
            steps = [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + statement, parameters)]
            assert "USE TEMP B-TREE FOR ORDER BY" not in steps, f"{name} sorts its window: {steps}\n{statement}"


def test_a_scrape_reads_finished_jobs_through_an_index_range_on_completed_at(ledger):
    statements = executed(ledger, QUESTIONS["metrics scrape"])
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        steps = [row[3] for s, p in statements for row in raw.execute("EXPLAIN QUERY PLAN " + s, p)]
    ranges = [s for s in steps if "ix_tether_jobs_done (status=? AND completed_at>? AND completed_at<?)" in s]
    assert ranges, steps


def test_a_scrape_counts_failed_jobs_by_type_from_their_own_index_not_their_rows(ledger):
    statements = executed(ledger, QUESTIONS["metrics scrape"])
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        steps = [row[3] for s, p in statements for row in raw.execute("EXPLAIN QUERY PLAN " + s, p)]
    assert "SCAN tether_jobs USING INDEX ix_tether_jobs_failed" in steps, steps


def test_jobs_are_counted_through_the_backlog_and_finished_indexes_only(ledger):
    statements = executed(ledger, QUESTIONS["stats"])
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        used = " | ".join(row[3] for s, p in statements for row in raw.execute("EXPLAIN QUERY PLAN " + s, p))
    for index in ("ix_tether_jobs_queue", "ix_tether_jobs_claimed_lock", "ix_tether_jobs_done"):
        assert index in used, used


def test_stats_walks_the_pending_jobs_once(ledger):
    """Counting the backlog by type and finding its oldest job are one walk of the pending index:
    each step of it reads a row (the index holds neither the type nor the status)."""
    statements = executed(ledger, QUESTIONS["stats"])
    with ledger.engine.connect() as conn:
        raw = conn.connection.driver_connection
        walks = [
            s
            for s, p in statements
            if any("ix_tether_jobs_queue" in row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + s, p))
        ]
    assert len(walks) == 1, walks


def test_the_deepest_target_is_counted_from_the_active_jobs_alone_however_long_the_history(tmp_path):
    """2,000 completed jobs on targets and none active, analyzed: SQLite would count the deepest
    target by walking every targeted job (its index has statistics, the empty one of active
    jobs has none); ``tether status`` names the index of active jobs."""
    c = Coordinator.open(f"sqlite:///{tmp_path / 'deep.db'}", root=tmp_path / "data", registry=default_registry())
    at = NOW.strftime("%Y-%m-%d %H:%M:%S.%f")
    with c.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts, created_at,"
            " run_at, claimed_at, completed_at, ordering_key) VALUES (?, 'create_file', '{}', 'completed', 0, 1, 3,"
            " ?, ?, ?, ?, ?)",
            [(f"{i:026d}", at, at, at, at, f"file:{i % 20}") for i in range(2000)],
        )
        conn.exec_driver_sql("ANALYZE")
        statement = health.stats_statements(NOW, NOW, c.engine.dialect.name)["deepest"]
        compiled = str(statement.compile(dialect=c.engine.dialect, compile_kwargs={"literal_binds": True}))
        steps = [row[3] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + compiled)]
    c.close()
    assert any("ix_tether_jobs_target_active" in s for s in steps), steps
