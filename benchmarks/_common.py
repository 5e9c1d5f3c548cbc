"""Shared pieces of the benchmarks: scratch directories, the bare sqlite3 baseline, statistics."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / ".bench"  # gitignored; on the same disk as the repo

# SQLAlchemy's SQLite DATETIME storage format, so bare rows compare like tether's.
_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"


@contextmanager
def scratch(base: Path, label: str) -> Iterator[Path]:
    """A fresh directory under ``base`` for one measurement, removed afterwards."""
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_child(script: str, src: Path, spec: dict[str, Any], *, prefix: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``script --child SPEC`` in a fresh interpreter with ``src`` (a checkout's ``src``) first
    on ``PYTHONPATH`` and no ``TETHER_`` variables (``prefix``, e.g. strace, goes before it); returns
    the JSON of its last stdout line, whose ``src`` (None on a bare side) must be that tree's
    tether, so a mistyped path cannot measure the wrong tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(Path(script).parent)])
    argv = [*prefix, sys.executable, script, "--child", json.dumps(spec)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"child {spec.get('figure', spec)} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result.get("src") is not None and Path(result["src"]).resolve() != (src / "tether").resolve():
        raise RuntimeError(f"measured the tether in {result['src']}, not the one in {src}")
    return result


PG_CHILD_PRELUDE = """
import os, sys
import pg_jobtypes
from tether import Coordinator, CreateFile
from tether.jobtypes import default_registry
try:
    from tether.ledger import pausing
    pausing.REFRESH = 1e9
except ImportError:  # a tree from before the paused types
    pass
registry = default_registry()
pg_jobtypes.register(registry)
"""
"""The start of a PostgreSQL benchmark's child script (run with a tree's src and tests first on
sys.path): the no-op and create_file types registered, the paused types read once."""

NOOP_TYPE = """
from typing import ClassVar
from tether import Coordinator, JobType, Payload

class Noop(Payload):
    job_type: ClassVar[str] = "noop"
    n: int

class NoopType(JobType[Noop]):
    name = "noop"
    payload_model = Noop
    def run(self, payload, ctx):
        return None
"""
"""Child-script text defining a ``noop`` job type (``Noop(n=...)``, ``NoopType()``) and importing
``Coordinator``, for the ``python -c`` children that time the hot path on small jobs (drain_ab.py,
otel_overhead.py); the child's own lines go before and after it."""


def tree_options(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmark that measures checkouts side by side in children (``run_child``):
    ``--before`` and ``--after`` (each a checkout's ``src``) and the hidden ``--child SPEC``."""
    parser.add_argument("--before", type=Path, help="src/ of the checkout to compare with")
    parser.add_argument("--after", type=Path, default=REPO / "src", help="src/ measured as after (default: this one)")
    parser.add_argument("--child", help=argparse.SUPPRESS)


def trees_or_child(args: argparse.Namespace, child: Callable[[dict[str, Any]], Any]) -> dict[str, Path] | None:
    """In a child (``--child SPEC``): ``child(SPEC)`` printed as the JSON line ``run_child`` reads,
    and None. Otherwise the trees to measure by side, ``before`` (if given) first."""
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return None
    trees = {"after": args.after.resolve()}
    return {"before": args.before.resolve(), **trees} if args.before else trees


def sqlite_now() -> str:
    """Now, as tether stores times in SQLite (naive UTC text, fixed width)."""
    return datetime.now(UTC).strftime(_SQLITE_TIME)


def sqlite_time(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).strftime(_SQLITE_TIME)


# A bare enqueue: tether's INSERT of a new job without its checks, of the row tether built
# (``bare_row``), so both sides write the same bytes (core.py, anchors.py, limits.py).
BARE_INSERT = """
INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts,
                         created_at, run_at, idempotency_key, ordering_key, parent_id, timeout, payload_bytes)
VALUES (?, ?, ?, 'pending', ?, 0, ?, ?, ?, ?, ?, ?, ?, ?)
"""


# A bare batch claim: ``LIMIT ?`` pending jobs in queue order claimed in one statement, as
# tether's batched claim does (anchors.py, limits.py); parameters: worker, now, now, now, limit.
BARE_CLAIM_N = """
UPDATE tether_jobs SET status = 'claimed', locked_by = ?, locked_at = ?, claimed_at = ?, attempts = attempts + 1
WHERE id IN (SELECT id FROM tether_jobs INDEXED BY ix_tether_jobs_queue
             WHERE status = 'pending' AND blocked = 0 AND run_at <= ?
             ORDER BY priority DESC, created_at, id LIMIT ?)
RETURNING id, attempts, payload
"""


def bare_row(r: Any, time: Callable[[datetime], Any] = sqlite_time) -> tuple[Any, ...]:
    """The parameters of ``BARE_INSERT`` for ``r``, a JobRecord tether built (``queue.build``);
    ``time`` writes its times as the database stores them (SQLite's text by default)."""
    return (
        r.id,
        r.type,
        r.payload,
        r.priority,
        r.max_attempts,
        time(r.created_at),
        time(r.run_at),
        r.idempotency_key,
        r.ordering_key,
        r.parent_id,
        r.timeout,
        r.payload_bytes,
    )


def bare_connect(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection set up like tether's: WAL, synchronous=FULL, autocommit mode
    so the loop issues its own BEGIN IMMEDIATE / COMMIT."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=30000")
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if mode != "wal" or sync != 2:
        raise RuntimeError(f"bare connection is not WAL + FULL: journal_mode={mode}, synchronous={sync}")
    return conn


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_replace(tmp: str, target: str, data: bytes, flags: int = 0) -> None:
    """The bare baseline's durable file write: ``data`` to a new ``tmp`` (exclusive create, extra
    open ``flags``), fsync, rename over ``target``, fsync its directory; what tether's create_file
    does without its path checks and lock (core.py's handler, file_limits.py's bare child)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    fsync_dir(os.path.dirname(target))


def median_ms(fn: Callable[[], Any], repeat: int, after: Callable[[], Any] | None = None) -> float:
    """The median of ``repeat`` timed calls of ``fn``, in milliseconds, after one untimed call that
    warms the page cache, as an operator's (or a scraper's) second look would; ``after``, untimed,
    follows every call and undoes what it changed (flat.py: claimed jobs put back)."""
    fn()
    if after:
        after()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
        if after:
            after()
    return statistics.median(times)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no samples")
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def median_interval(values: Sequence[float], draws: int = 2000) -> tuple[float, float, float]:
    """The median of ``values`` (e.g. each round's after / before, a pair measured side by side)
    and a 90 % bootstrap interval of it, resampling the values (seeded: a rerun prints the same)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return statistics.median(values), medians[draws // 20], medians[draws - draws // 20 - 1]


def machine() -> str:
    """One line naming what the figures were measured on."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = "?"
    try:
        best = ""
        target = os.path.realpath(SCRATCH.parent)
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if (
                len(parts) >= 3
                and (target == parts[1] or target.startswith(parts[1].rstrip("/") + "/"))
                and len(parts[1]) > len(best)
            ):
                best, fs = parts[1], f"{parts[2]} on {parts[0]}"
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, disk {fs}"
    )
