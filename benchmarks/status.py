"""How fast the operator's questions are on a 1,000,000-job SQLite ledger, and their query plans.

Builds the ledger by bulk insert (realistic mix: ~97% completed over 30 days, a backlog of
pending jobs, claimed jobs of which some are stuck, failures, re-used idempotency keys), then
times each observe function (median of --repeat runs) against a baseline measured in the same
run: a bare-sqlite3 full-table GROUP BY, i.e. what a naive status would cost. Prints each
query's EXPLAIN QUERY PLAN and flags full scans of the table. With --with-indexes it adds the
candidate indexes to the same ledger and times everything again.

    .venv/bin/python benchmarks/status.py            # 1,000,000 jobs
    .venv/bin/python benchmarks/status.py --jobs 100000 --with-indexes
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from ulid import ULID

from _common import median_ms
from tether import SystemClock
from tether.ledger.engine import create_engine, ensure_schema
from tether.observe import duplicates, durations, finished, health, jobs, metrics, readonly, retention, stuck

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / ".bench"
_FMT = "%Y-%m-%d %H:%M:%S.%f"  # SQLAlchemy's SQLite DATETIME text form
TYPES = ["create_file", "delete_file", "sync_aws", "claude_extraction", "notify"]
CANDIDATE_INDEXES = {
    "ix_tether_jobs_status_type": "CREATE INDEX IF NOT EXISTS ix_tether_jobs_status_type ON tether_jobs (status, type)",
    "ix_tether_jobs_key": "CREATE INDEX IF NOT EXISTS ix_tether_jobs_key ON tether_jobs (type, idempotency_key) "
    "WHERE idempotency_key IS NOT NULL",
}


def build(path: Path, n: int, now: datetime, seed: int = 7) -> dict[str, int]:
    """Insert ``n`` jobs straight into a tether-created table; returns the count per status."""
    engine = create_engine(f"sqlite:///{path}", durability="normal")
    ensure_schema(engine)
    engine.dispose()
    rng = random.Random(seed)
    pending, claimed, stuck, failed = n // 50, max(10, n // 10_000), max(2, n // 100_000), n // 100
    completed = n - pending - claimed - failed
    rows: list[tuple[Any, ...]] = []
    counts = {"completed": completed, "failed": failed, "pending": pending, "claimed": claimed}

    def t(d: datetime | None) -> str | None:
        return None if d is None else d.strftime(_FMT)

    def add(
        status: str,
        created: datetime,
        claimed_at: datetime | None,
        done: datetime | None,
        locked_by: str | None = None,
        locked_at: datetime | None = None,
        attempts: int = 1,
        error: str | None = None,
    ) -> None:
        job_type = rng.choice(TYPES)
        key = None
        if job_type == "claude_extraction":  # finished jobs re-use keys; active ones are unique
            key = f"req-{rng.randrange(n // 4)}" if done else f"req-active-{len(rows)}"
        target = f"file:data/{rng.randrange(n // 3)}.json" if job_type in ("create_file", "delete_file") else None
        if job_type == "sync_aws":  # one resource per hundred jobs, as repeated syncs of a fleet leave
            target = f"aws:s3_bucket:eu-west-1:bucket-{rng.randrange(max(1, n // 100))}"
        result = None
        if status == "completed":
            result = '{"bytes":1}'
            if job_type == "claude_extraction":  # the assistant's bill, as assistant.spend() records it
                model = rng.choice(("claude-sonnet", "claude-haiku"))
                result = f'{{"bytes":1,"cost_usd":0.0123,"input_tokens":900,"output_tokens":300,"model":"{model}"}}'
        rows.append(
            (
                str(ULID.from_datetime(created)),
                job_type,
                '{"path":"data/x.json"}',
                status,
                0,
                attempts,
                3,
                error,
                locked_by,
                t(locked_at),
                t(created),
                t(claimed_at),
                t(done),
                t(created),
                key,
                target,
                None,
                result,
            )
        )

    for _ in range(completed + failed):
        done = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
        took = timedelta(seconds=rng.lognormvariate(-1.5, 1.2))
        start = done - took
        created = start - timedelta(seconds=rng.expovariate(1 / 5))
        if len(rows) < failed:
            add("failed", created, start, done, attempts=3, error="RuntimeError: upstream said no\n  ...")
        else:
            add("completed", created, start, done)
    for _ in range(pending):
        add("pending", now - timedelta(seconds=rng.uniform(0, 1800)), None, None, attempts=0)
    for i in range(claimed):
        age = rng.uniform(400, 5000) if i < stuck else rng.uniform(0, 60)
        at = now - timedelta(seconds=age)
        add("claimed", at - timedelta(seconds=3), at, None, locked_by=f"host:{i % 4}", locked_at=at)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts, last_error, "
        "locked_by, locked_at, created_at, claimed_at, completed_at, run_at, idempotency_key, ordering_key, "
        "parent_id, result) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    # Move the bulk insert out of the WAL, as SQLite's automatic checkpoints do in service;
    # readers of a 450 MB WAL would otherwise be measured instead of the queries.
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    counts["stuck"] = stuck
    return counts


def plans(engine: sa.Engine, fn: Callable[[], Any]) -> list[tuple[str, list[str]]]:
    """EXPLAIN QUERY PLAN of every SELECT ``fn`` runs on ``engine``."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _many):
        if statement.lstrip().upper().startswith("SELECT") and "sqlite_master" not in statement:
            seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        fn()
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    out = []
    raw = engine.raw_connection()
    done = set()
    try:
        for statement, parameters in seen:
            if statement in done:
                continue
            done.add(statement)
            rows = raw.cursor().execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall()
            out.append((" ".join(statement.split()), [r[-1] for r in rows]))
    finally:
        raw.close()
    return out


def full_scan(detail: str) -> bool:
    """A plan step that reads every row of tether_jobs (or every entry of an index on it)."""
    d = detail.upper()
    return d.startswith("SCAN TETHER_JOBS") or d.startswith("SCAN NEWER")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--with-indexes", action="store_true", help="also time with the candidate indexes")
    ap.add_argument("--keep", action="store_true", help="keep the ledger (path printed)")
    ap.add_argument("--ledger", type=Path, help="time this existing ledger (from --keep) instead of building one")
    args = ap.parse_args()
    SCRATCH.mkdir(exist_ok=True)
    now = SystemClock().now()
    if args.ledger:
        path = args.ledger.resolve()
        workdir = path.parent
        args.keep = True
        with sqlite3.connect(path) as c:
            counts = dict(c.execute("SELECT status, count(*) FROM tether_jobs GROUP BY status").fetchall())
        print(f"ledger: {sum(counts.values()):,} jobs {counts} (existing) at {path}")
    else:
        workdir = Path(tempfile.mkdtemp(prefix="status-", dir=SCRATCH))
        path = workdir / "tether.db"
        start = time.perf_counter()
        counts = build(path, args.jobs, now)
        print(
            f"ledger: {args.jobs:,} jobs {counts} built in {time.perf_counter() - start:.1f}s "
            f"({path.stat().st_size / 1e6:.0f} MB) at {path}",
            flush=True,
        )

    def baseline() -> Any:
        c = sqlite3.connect(path)
        try:
            return c.execute("SELECT status, type, count(*) FROM tether_jobs GROUP BY status, type").fetchall()
        finally:
            c.close()

    engine = readonly.open_ledger(f"sqlite:///{path}")
    from tether.cli import main as cli_main

    def cli_status() -> None:
        sys.argv = ["tether", "--db", f"sqlite:///{path}", "status", "--json"]
        saved = sys.stdout
        sys.stdout = open("/dev/null", "w")
        try:
            cli_main()
        except SystemExit:
            pass
        finally:
            sys.stdout.close()
            sys.stdout = saved

    cases: dict[str, Callable[[], Any]] = {
        "stats (tether status queries)": lambda: health.stats(engine),
        "health (stats + verdict)": lambda: health.health(engine),
        "tether status --json (in-process CLI, opens the ledger)": cli_status,
        "failed --limit 50": lambda: finished.failed(engine, limit=50),
        "stuck": lambda: stuck.stuck(engine),
        "recent --since 1h": lambda: finished.recent(engine, since=timedelta(hours=1)),
        "durations --since 1h": lambda: durations.durations(engine, since=timedelta(hours=1)),
        "durations --since 24h": lambda: durations.durations(engine, since=timedelta(hours=24)),
        "jobs --limit 50": lambda: jobs.jobs(engine, limit=50),
        "jobs --status pending --limit 50": lambda: jobs.jobs(engine, status="pending", limit=50),
        "jobs --since 10m --limit 50": lambda: jobs.jobs(engine, since=now - timedelta(minutes=10), limit=50),
        "show ID": lambda: jobs.show(engine, ids_one),
        "duplicates --limit 50": lambda: duplicates.duplicates(engine, limit=50),
        "counts by status, type (metrics)": lambda: jobs.counts(engine),
        "metrics exposition": lambda: metrics.exposition(engine),
        "purge --completed --older-than 7d --dry-run": lambda: retention.purge(
            engine, older_than=timedelta(days=7), dry_run=True
        ),
    }
    ids_one = jobs.jobs(engine, limit=1)[0].id
    slow = {
        "duplicates --limit 50",
        "counts by status, type (metrics)",
        "metrics exposition",
        "purge --completed --older-than 7d --dry-run",
    }

    def measure(label: str) -> dict[str, float]:
        base = median_ms(baseline, args.repeat)
        print(f"\n== {label}: median of {args.repeat}, ms (ratio to the baseline full-table GROUP BY, {base:.1f} ms)")
        results = {"baseline full scan": base}
        for name, fn in cases.items():
            reps = max(3, args.repeat // 2) if name in slow else args.repeat
            ms = median_ms(fn, reps)
            results[name] = ms
            print(f"{name:<58} {ms:9.2f} ms  {ms / base:6.3f}x")
        return results

    first = measure("schema indexes only")
    print("\n== query plans (FULL = reads the whole table)")
    for name, fn in cases.items():
        if name.startswith("tether status") or name.startswith("metrics") or name.startswith("health"):
            continue
        for statement, steps in plans(engine, fn):
            flag = "FULL " if any(full_scan(s) for s in steps) else "ok   "
            print(f"{flag}{name}: {statement[:110]}")
            for s in steps:
                print(f"       {s}")
    result = {"jobs": args.jobs, "counts": counts, "schema_indexes": first}
    if args.with_indexes:
        engine.dispose()
        c = sqlite3.connect(path)
        for name, ddl in CANDIDATE_INDEXES.items():
            t0 = time.perf_counter()
            c.execute(ddl)
            print(f"created {name} in {time.perf_counter() - t0:.1f}s")
        c.execute("ANALYZE")
        c.close()
        engine = readonly.open_ledger(f"sqlite:///{path}")
        result["with_candidate_indexes"] = measure("with candidate indexes " + ", ".join(CANDIDATE_INDEXES))
        for name in (
            "duplicates --limit 50",
            "counts by status, type (metrics)",
            "purge --completed --older-than 7d --dry-run",
        ):
            for _statement, steps in plans(engine, cases[name]):
                print(f"{name}: {' | '.join(steps)}")
    engine.dispose()
    print(
        "\n"
        + json.dumps(
            {
                "status_ms": first["stats (tether status queries)"],
                "status_cli_ms": first["tether status --json (in-process CLI, opens the ledger)"],
                "baseline_ms": first["baseline full scan"],
            }
        )
    )
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
