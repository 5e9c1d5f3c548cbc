"""Group commit on SQLite writes the jobs of the callers sharing a commit in one statement
(INSERT_ROWS, ledger/enqueue.py), and stores them exactly as one insert a caller stores them."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from test_group_commit import REJECT, Callers, Commits, enqueue_file, grouped, run_sql, until
from tether import Coordinator, CreateFile
from tether.ledger import enqueue, sqlite

# What each caller enqueues: two on one target (the younger is held back behind the older), and
# every option a single enqueue can set.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("shared.json", {}),
    ("shared.json", {"priority": 3}),
    ("later.json", {"delay": 90}),
    ("options.json", {"priority": -2, "max_attempts": 7, "timeout": 2.5}),
    ("plain.json", {}),
    ("deep/er/file.json", {}),
]

COLUMNS = (
    "type, payload, status, priority, attempts, max_attempts, idempotency_key, ordering_key, parent_id, timeout,"
    " payload_bytes, traceparent, blocked, round((julianday(run_at) - julianday(created_at)) * 86400)"
)


def call(c: Coordinator, k: int) -> Any:
    path, options = CALLS[k]
    # Text that JSON escapes, so the statement's rows must give back each payload as it was.
    content: dict[str, Any] = {"k": k, "text": 'é "quoted" \\ back\nslash \u2028 \U0001f600'}
    return c.enqueue(CreateFile(path=path, content=content), **options)


def rows(c: Coordinator) -> list[tuple[Any, ...]]:
    """Every job but the group's leaders, in id order (the order a target's jobs run in)."""
    with c.engine.connect() as conn:
        query = f"SELECT {COLUMNS} FROM tether_jobs WHERE payload NOT LIKE '%leader%' ORDER BY id"
        return [tuple(row) for row in conn.execute(sa.text(query))]


def _waiting(c: Coordinator, count: int) -> bool:
    return c.queue.enqueuer.group.waiting == count


def together(c: Coordinator, monkeypatch: pytest.MonkeyPatch, count: int) -> tuple[Commits, list[str]]:
    """``count`` callers of CALLS, started in order while a commit is in flight, so that they share
    the next one; returns the commits and the statements each ``_WriteCursor.insert`` was given."""
    statements: list[str] = []
    insert = sqlite._WriteCursor.insert

    def recorded(self: Any, statement: str, values: Any) -> None:
        statements.append(statement)
        insert(self, statement, values)

    monkeypatch.setattr(sqlite._WriteCursor, "insert", recorded)
    commits = Commits(monkeypatch, c)
    callers = Callers()
    with grouped(c, commits, callers):
        for k in range(count):
            callers.start(f"caller{k}", partial(call, c, k))
            # One at a time, so their ids (and which of two on a target is older) follow CALLS.
            until(partial(_waiting, c, k + 1), f"caller{k} waits")
    callers.join()
    failed = {name: r for name, r in callers.outcomes.items() if isinstance(r, Exception)}
    assert not failed
    return commits, statements


def test_callers_sharing_a_commit_on_sqlite_are_inserted_by_one_statement(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Coordinator.open(f"sqlite:///{tmp_path / 'ledger.db'}", root=root) as c:
        commits, statements = together(c, monkeypatch, len(CALLS))
        sql = c.queue.backend.sql
        # The leader alone (its own insert), then the six callers in one statement.
        assert statements == [sql.INSERT_ON_TARGET, sql.INSERT_ROWS]
        assert sorted(map(len, commits.committed)) == [1, len(CALLS)]


def test_jobs_inserted_together_are_stored_as_one_insert_a_caller_stores_them(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Coordinator.open(f"sqlite:///{tmp_path / 'together.db'}", root=root) as c:
        together(c, monkeypatch, len(CALLS))
        grouped_rows = rows(c)
    with Coordinator.open(f"sqlite:///{tmp_path / 'alone.db'}", root=tmp_path / "alone") as c:
        for k in range(len(CALLS)):
            call(c, k)
        alone_rows = rows(c)
    assert grouped_rows == alone_rows
    blocked = {(row[7], row[12]) for row in alone_rows}
    assert ("file:shared.json", 1) in blocked and ("file:shared.json", 0) in blocked  # the case is there


def test_callers_whose_payloads_one_statement_cannot_carry_commit_together_in_several(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(enqueue, "_JSON_CHARS", 1)  # a statement a job
    with Coordinator.open(f"sqlite:///{tmp_path / 'ledger.db'}", root=root) as c:
        commits, statements = together(c, monkeypatch, 3)
        sql = c.queue.backend.sql
        assert statements == [sql.INSERT_ON_TARGET] + [sql.INSERT_ROWS] * 3
        assert sorted(map(len, commits.committed)) == [1, 3]  # one transaction all the same
        assert len(rows(c)) == 3


@pytest.mark.parametrize("chars", [enqueue._JSON_CHARS, 1], ids=["one statement", "a statement a job"])
def test_a_refused_job_among_callers_inserted_together_fails_only_its_own_caller(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch, chars: int
) -> None:
    # One statement: the refusal comes at the commit. A statement a job: from the second statement,
    # inside the transaction. Either way the batch runs again statement by statement.
    monkeypatch.setattr(enqueue, "_JSON_CHARS", chars)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with Coordinator.open(url, root=root) as c:
        run_sql(url, REJECT["sqlite"])
        commits = Commits(monkeypatch, c)
        callers = Callers()
        with grouped(c, commits, callers):
            callers.start("first", partial(enqueue_file, c, "first.json"))
            until(partial(_waiting, c, 1), "the first caller waits")
            callers.start("refused", partial(enqueue_file, c, "refused.json", reject=True))
            until(partial(_waiting, c, 2), "the refused caller waits")
            callers.start("last", partial(enqueue_file, c, "last.json"))
            until(partial(_waiting, c, 3), "every caller waits")
        callers.join()
        assert isinstance(callers.outcomes["refused"], Exception)
        assert "refused by the test" in str(callers.outcomes["refused"])
        kept = {callers.outcomes[name].job.id for name in ("first", "last")}
        with c.engine.connect() as conn:
            stored = set(
                conn.execute(sa.text("SELECT id FROM tether_jobs WHERE payload NOT LIKE '%leader%'")).scalars()
            )
        assert stored == kept
        assert commits.holding(next(iter(kept))) == kept  # the two others still share a commit
