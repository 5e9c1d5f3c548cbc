"""A large ledger for the metrics benchmark: N completed jobs, 2,000 pending, a few claimed (some
stuck) and failed, loaded straight into a tether-created table on SQLite or PostgreSQL.

``spread`` is how far back the completions go: 30 days is a ledger in service (a one-hour window
holds ~1/720 of it); one hour is a ledger just drained (every completion inside the window).
"""

from __future__ import annotations

import io
import random
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from ulid import ULID

from tether.ledger.engine import create_engine, ensure_schema

TYPES = ["create_file", "delete_file", "sync_aws", "claude_extraction", "notify"]
COLUMNS = (
    "id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at, "
    "created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, parent_id, result"
)
# What a completed claude_extraction's result records (an assistant's envelope), different for
# every job as real ones are (a cache keyed on the text would find nothing to reuse): what the
# metrics' spend families parse, on the rows that carry a cost only.
EXTRACTION_RESULT = (
    '{{"bytes":{bytes},"sha256":"{digest}","prompt_hash":"{digest}","cost_usd":{cost},'
    '"input_tokens":{tokens_in},"output_tokens":{tokens_out},"cache_read_input_tokens":0,'
    '"cache_creation_input_tokens":0,"duration_ms":{ms},"model":"claude-sonnet-4-5","session_id":"{session}",'
    '"num_turns":1,"assistant_called":true,"written":true}}'
)
PENDING = 2_000
CLAIMED = 20
STUCK = 4


def extraction_result(rng: random.Random) -> str:
    """A completed claude_extraction's result (EXTRACTION_RESULT), its fields drawn from ``rng``;
    shared with big_ledger.py, whose extractions record the same envelope."""
    return EXTRACTION_RESULT.format(
        bytes=rng.randrange(200, 2000),
        digest=rng.randbytes(32).hex(),
        cost=round(rng.uniform(0.002, 0.05), 6),
        tokens_in=rng.randrange(300, 3000),
        tokens_out=rng.randrange(50, 800),
        ms=rng.randrange(2000, 30000),
        session=rng.randbytes(16).hex(),
    )


def result(rng: random.Random, job_type: str) -> str:
    """A completed job's result: an extraction's envelope fields, else a file's size."""
    if job_type != "claude_extraction":
        return f'{{"bytes":{rng.randrange(1 << 20)}}}'
    return extraction_result(rng)


def rows(completed: int, now: datetime, spread: timedelta, seed: int = 7) -> Iterator[tuple[Any, ...]]:
    """Every job as a tuple of COLUMNS (times as aware datetimes)."""
    rng = random.Random(seed)
    failed = max(10, completed // 1000)

    def row(status: str, created: datetime, claimed: datetime | None, done: datetime | None, **kw: Any) -> tuple:
        job_type = rng.choice(TYPES)
        target = f"file:data/{rng.randrange(1 + completed // 3)}.json" if job_type.endswith("_file") else None
        return (
            str(ULID.from_datetime(created)),
            job_type,
            '{"path":"data/x.json"}',
            status,
            0,
            kw.get("attempts", 1),
            3,
            kw.get("error"),
            kw.get("locked_by"),
            kw.get("locked_at"),
            created,
            claimed,
            done,
            kw.get("run_at", created),
            None,
            target,
            None,
            result(rng, job_type) if status == "completed" else None,
        )

    for i in range(completed + failed):
        done = now - timedelta(seconds=rng.uniform(1, spread.total_seconds()))
        took = timedelta(seconds=rng.lognormvariate(-1.5, 1.2))
        start = done - took
        created = start - timedelta(seconds=rng.expovariate(1 / 5))
        if i < failed:
            yield row("failed", created, start, done, attempts=3, error="RuntimeError: upstream said no")
        else:
            yield row("completed", created, start, done, attempts=1 if rng.random() < 0.97 else 2)
    for _ in range(PENDING):
        yield row("pending", now - timedelta(seconds=rng.uniform(0, 600)), None, None, attempts=0)
    for i in range(CLAIMED):
        at = now - timedelta(seconds=rng.uniform(400, 5000) if i < STUCK else rng.uniform(0, 60))
        yield row("claimed", at - timedelta(seconds=3), at, None, locked_by=f"host:{i % 4}", locked_at=at)


def _sqlite_text(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")  # SQLAlchemy's SQLite form
    return value


def load_sqlite(path: str, completed: int, now: datetime, spread: timedelta) -> None:
    engine = create_engine(f"sqlite:///{path}", durability="normal")
    ensure_schema(engine)
    engine.dispose()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    conn.executemany(
        f"INSERT INTO tether_jobs ({COLUMNS}) VALUES ({', '.join('?' * 18)})",
        (tuple(_sqlite_text(v) for v in r) for r in rows(completed, now, spread)),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def _copy_text(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def load_postgres(url: str, completed: int, now: datetime, spread: timedelta) -> None:
    """COPY into a fresh table (indexes built afterwards, as a restore would), then VACUUM ANALYZE
    so index-only scans see an up-to-date visibility map, as autovacuum leaves a table in service."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS tether_jobs")
    ensure_schema(engine)
    with engine.begin() as conn:
        indexes = conn.execute(
            sa.text(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'tether_jobs' AND indexname LIKE 'i%'"
            )
        ).all()
        for name, _ in indexes:
            conn.exec_driver_sql(f"DROP INDEX {name}")
        raw = conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy(f"COPY tether_jobs ({COLUMNS}) FROM STDIN") as copy:
            buf = io.StringIO()
            for n, r in enumerate(rows(completed, now, spread), 1):
                buf.write("\t".join(_copy_text(v) for v in r) + "\n")
                if n % 50_000 == 0:
                    copy.write(buf.getvalue())
                    buf = io.StringIO()
            copy.write(buf.getvalue())
        for _, ddl in indexes:
            conn.exec_driver_sql(ddl)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE tether_jobs")
    engine.dispose()
