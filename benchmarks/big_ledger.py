"""A ledger of years of history, built by bulk insert: N finished jobs, 20,000 pending, a few
claimed, and the data files its file targets name, for ``flat.py`` (does an operation cost the
same at 100,000 and at 10,000,000 jobs?).

The history is the same at every size, only longer: one job finishes every ``--interval``
seconds (default 6 s: 14,400 a day), the newest a moment ago, so the last hour or day holds the
same jobs at 100,000 as at 10,000,000 (which then reaches back 1.9 years). Of the finished jobs:

- 1 in 20 a ``claude_extraction`` without a target whose result records a cost (what the spend
  families and ``durations`` sum);
- 1 in 1,000 a ``create_file`` that failed;
- the rest ``create_file`` jobs on ``--targets`` targets (default 100,000) taken in turn, so at
  10,000,000 jobs each target's history holds about 95 jobs, its latest completed one last.
  Every version of a target writes the same bytes, and ``--root`` gets exactly those files: a
  reconcile of the ledger finds every target in sync.

Then 20,000 pending ``notify`` jobs (no target, created over the last 10 minutes) and 20
claimed (4 of them stuck). The table's indexes and the triggers that keep ``tether_targets`` are
dropped for the load and made afterwards (as a restore does): the indexes built, ANALYZE run, as
a ledger in service has, and the triggers made and the targets table filled by the next
``Coordinator.open``, which finds them missing.

    nice -n 10 .venv/bin/python benchmarks/big_ledger.py --jobs 10000000 \
        --db /work/big/ledger-10m.db --root /work/big/data-10m
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether import Coordinator
from tether.jobtypes.create_file import render_fields
from tether.jobtypes.target import file_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
from metrics_ledger import extraction_result  # noqa: E402

PENDING = 20_000
CLAIMED, STUCK = 20, 4
_FMT = "%Y-%m-%d %H:%M:%S.%f"  # SQLAlchemy's SQLite DATETIME text form
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
COLUMNS = (
    "id, type, payload, status, priority, attempts, max_attempts, last_error, locked_by, locked_at, created_at, "
    "claimed_at, completed_at, run_at, ordering_key, result, payload_bytes, blocked, snoozes"
)


def ulid(ms: int, serial: int) -> str:
    """A ULID of millisecond ``ms`` whose 80 low bits are ``serial``: unique and in time order."""
    value = (ms << 80) | serial
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def target_path(t: int) -> str:
    return f"d{t % 1000:03d}/{t:07d}.json"


def target_payload(t: int) -> tuple[str, bytes]:
    """A target's create_file payload (JSON text) and the bytes every version of it writes."""
    content = {"id": t, "name": f"item {t}", "tags": ["a", "b"]}
    payload = f'{{"path":"{target_path(t)}","content":{{"id":{t},"name":"item {t}","tags":["a","b"]}}}}'
    return payload, render_fields(content, None)


def rows(
    jobs: int, targets: int, interval: float, now: datetime, written: bytearray, seed: int = 7
) -> Iterator[tuple[Any, ...]]:
    """Every job as a tuple of COLUMNS; marks in ``written`` each target a completed job wrote."""
    rng = random.Random(seed)
    payloads = [target_payload(t)[0] for t in range(targets)]
    keys = [file_key(target_path(t)) for t in range(targets)]
    first = now - timedelta(seconds=jobs * interval)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    extraction = '{"prompt":"summarise","source":"inbox/x.txt"}'
    turn = 0
    for k in range(jobs):
        done = first + timedelta(seconds=(k + 1) * interval + rng.random() * interval * 0.9)
        took = timedelta(seconds=min(600.0, rng.lognormvariate(-1.5, 1.2)))
        claimed = done - took
        created = claimed - timedelta(seconds=rng.expovariate(1 / 5))
        ms = (created - epoch) // timedelta(milliseconds=1)
        job_id = ulid(ms, k)
        at = (created.strftime(_FMT), claimed.strftime(_FMT), done.strftime(_FMT))
        if k % 20 == 19:
            result = extraction_result(rng)
            yield (job_id, "claude_extraction", extraction, "completed", 0, 1, 3, None, "w:1", at[1], at[0],
                   at[1], at[2], at[0], None, result, len(extraction), 0, 0)  # fmt: skip
            continue
        t = turn % targets
        turn += 1
        payload = payloads[t]
        if k % 1000 == 500:
            yield (job_id, "create_file", payload, "failed", 0, 3, 3, "OSError: disk full", None, None, at[0],
                   at[1], at[2], at[0], keys[t], None, len(payload), 0, 0)  # fmt: skip
            continue
        written[t] = 1
        yield (job_id, "create_file", payload, "completed", 0, 1, 3, None, "w:1", at[1], at[0], at[1], at[2],
               at[0], keys[t], '{"bytes":64}', len(payload), 0, 0)  # fmt: skip
    notify = '{"to":"ops@example.com","subject":"nightly report"}'
    for n in range(PENDING):
        created = now - timedelta(seconds=600 * (PENDING - n) / PENDING)
        ms = (created - epoch) // timedelta(milliseconds=1)
        c = created.strftime(_FMT)
        yield (ulid(ms, jobs + n), "notify", notify, "pending", 0, 0, 3, None, None, None, c, None, None, c,
               None, None, len(notify), 0, 0)  # fmt: skip
    for n in range(CLAIMED):
        claimed = now - timedelta(seconds=rng.uniform(400, 5000) if n < STUCK else rng.uniform(0, 60))
        created = claimed - timedelta(seconds=3)
        ms = (created - epoch) // timedelta(milliseconds=1)
        c, at = created.strftime(_FMT), claimed.strftime(_FMT)
        yield (ulid(ms, jobs + PENDING + n), "notify", notify, "claimed", 0, 1, 3, None, f"host:{n % 4}", at, c,
               at, None, c, None, None, len(notify), 0, 0)  # fmt: skip


def write_files(root: Path, written: bytearray) -> int:
    """The file of each target a completed job wrote; returns how many."""
    for d in range(1000):
        (root / f"d{d:03d}").mkdir(parents=True, exist_ok=True)
    n = 0
    for t, done in enumerate(written):
        if done:
            (root / target_path(t)).write_bytes(target_payload(t)[1])
            n += 1
    return n


def build(db: Path, root: Path, jobs: int, targets: int, interval: float) -> dict[str, float]:
    """Build the ledger at ``db`` and its files under ``root``; returns the seconds each part took."""
    took: dict[str, float] = {}
    start = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    c = Coordinator.open(f"sqlite:///{db}", root=root, durability="normal")
    now = c.clock.now()
    c.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-1000000")  # 1 GB: the index builds sort in memory
    indexes = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tether_jobs' AND sql IS NOT NULL"
    ).fetchall()
    for name, _ in indexes:
        conn.execute(f"DROP INDEX {name}")
    # A row trigger per insert would cost the load more than the insert itself.
    triggers = conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'tether_jobs'")
    for (name,) in triggers.fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("DELETE FROM tether_meta WHERE key = 'layout'")  # the next open checks the schema
    conn.execute("BEGIN")
    sql = f"INSERT INTO tether_jobs ({COLUMNS}) VALUES ({', '.join('?' * len(COLUMNS.split(',')))})"
    written = bytearray(targets)
    conn.executemany(sql, rows(jobs, targets, interval, now, written))
    conn.execute("COMMIT")
    took["insert"] = time.perf_counter() - start
    start = time.perf_counter()
    for _, ddl in indexes:
        conn.execute(ddl)
    conn.close()
    Coordinator.open(f"sqlite:///{db}", root=root, durability="normal").close()  # the triggers, the fill
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    took["indexes"] = time.perf_counter() - start
    start = time.perf_counter()
    took["targets"] = write_files(root, written)
    took["files"] = time.perf_counter() - start
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, required=True, help="finished jobs")
    ap.add_argument("--targets", type=int, default=100_000)
    ap.add_argument("--interval", type=float, default=6.0, help="seconds between completions")
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--root", type=Path, required=True, help="where the data files go")
    args = ap.parse_args()
    if args.db.exists():
        sys.exit(f"{args.db} exists: remove it first")
    took = build(args.db, args.root, args.jobs, args.targets, args.interval)
    size = os.path.getsize(args.db)
    total = took["insert"] + took["indexes"] + took["files"]
    print(
        f"built {args.jobs:,} finished + {PENDING:,} pending jobs in {total:.0f} s "
        f"(insert {took['insert']:.0f} s, indexes + ANALYZE + targets {took['indexes']:.0f} s, "
        f"{took['targets']:,.0f} files {took['files']:.0f} s); "
        f"{args.db} is {size / 2**30:.2f} GiB ({size / 2**20:,.0f} MiB)"
    )


if __name__ == "__main__":
    main()
