"""The core speed benchmark (issue 2): tether next to bare sqlite3 doing the same durable work.

    .venv/bin/python benchmarks/core.py [--jobs 2000] [--runs 3] [--worker batch=1] [--profile]

Three figures, each measured for tether and for a bare loop on the same disk in the same run
(enqueues alternate one by one; drains alternate which side goes first from run to run), with
SQLite WAL + synchronous=FULL on both sides; every figure is the median over runs:

  (a) single enqueue latency p50/p95: ``Coordinator.enqueue(CreateFile(...))`` against a bare
      BEGIN IMMEDIATE + INSERT of the same row + COMMIT;
  (b) drain of no-op jobs by one worker thread (``worker.run_until_idle()``) against a bare loop
      of claim-UPDATE commit + complete-UPDATE commit;
  (c) create_file jobs/s against a bare loop doing the same work by hand: claim commit, temp
      write + fsync + rename + fsync dir, complete commit.

Both sides use a table created by tether's own DDL (a Coordinator opens each file first).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import orjson

import _common
from _common import BARE_INSERT, SCRATCH, bare_connect, bare_row, machine, median, percentile, scratch, sqlite_now
from tether import Coordinator, CreateFile, JobContext, JobType, Payload
from tether.jobtypes import default_registry, render


class Noop(Payload):
    """The drain benchmark's job: carries a number, does nothing."""

    job_type: ClassVar[str] = "bench_noop"
    n: int


class NoopType(JobType[Noop]):
    name = "bench_noop"
    payload_model = Noop

    def run(self, payload: Noop, ctx: JobContext) -> None:
        return None


FILE_DIRS = 16  # files are spread over this many directories, created before timing (both sides)


def open_ledger(directory: Path) -> Coordinator:
    registry = default_registry()
    registry.register(NoopType())
    return Coordinator.open(
        f"sqlite:///{directory}/ledger.db", root=directory / "data", registry=registry, durability="full"
    )


def note(i: int) -> CreateFile:
    return CreateFile(
        path=f"d{i % FILE_DIRS:02d}/note-{i:06d}.json",
        overwrite=True,
        content={"id": i, "title": f"note {i}", "tags": ["bench", "tether"], "done": False},
    )


# -- bare SQL: the same table and claim index, no guarantees beyond fencing by owner + attempt ------

# The bare claim reads tether's partial index of pending jobs, as tether's claim does (SQLite
# would otherwise sort the pending rows of the status index).
BARE_CLAIM_PICK = """
SELECT id FROM tether_jobs INDEXED BY ix_tether_jobs_queue WHERE status = 'pending' AND blocked = 0 AND run_at <= ?
ORDER BY priority DESC, created_at, id LIMIT 1
"""
BARE_CLAIM = f"""
UPDATE tether_jobs SET status = 'claimed', locked_by = ?, locked_at = ?, claimed_at = ?,
                       attempts = attempts + 1
WHERE id = ({BARE_CLAIM_PICK.strip()})
RETURNING id, attempts, payload
"""
BARE_COMPLETE = """
UPDATE tether_jobs SET status = 'completed', locked_by = NULL, locked_at = NULL,
                       completed_at = ?, result = ?
WHERE id = ? AND status = 'claimed' AND locked_by = ? AND attempts = ?
"""


def check_bare_claim_plan(path: Path) -> str:
    """The bare claim must walk tether's claim index without a sort, or the baseline is unfair."""
    conn = bare_connect(path)
    try:
        plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + BARE_CLAIM_PICK, (sqlite_now(),)))
    finally:
        conn.close()
    if "ix_tether_jobs_queue" not in plan or "TEMP B-TREE" in plan:
        raise RuntimeError(f"bare claim does not use the claim index cleanly: {plan}")
    return plan


def bare_claim(conn: Any, worker: str) -> tuple[str, int, str] | None:
    now = sqlite_now()
    conn.execute("BEGIN IMMEDIATE")
    rows = conn.execute(BARE_CLAIM, (worker, now, now, now)).fetchall()
    conn.execute("COMMIT")
    return rows[0] if rows else None


def bare_complete(conn: Any, worker: str, job_id: str, attempts: int, result: str | None) -> None:
    conn.execute("BEGIN IMMEDIATE")
    cur = conn.execute(BARE_COMPLETE, (sqlite_now(), result, job_id, worker, attempts))
    conn.execute("COMMIT")
    if cur.rowcount != 1:
        raise RuntimeError(f"bare complete of {job_id} matched {cur.rowcount} rows")


# -- (a) single enqueue latency ----------------------------------------------------------------
# The enqueues alternate one by one between the sides (the side going first alternates too), so
# load from other processes on a shared machine hits both alike.


def enqueue_pair(directory: Path, n: int) -> tuple[list[float], list[float]]:
    """Latencies of ``n`` tether enqueues and ``n`` bare INSERT + commit of the same rows,
    alternating one by one (the side that goes first alternates too)."""
    payloads = [note(i) for i in range(n)]  # built before the clock starts, as the bare rows are
    with open_ledger(directory / "bare") as c:  # tether's DDL; rows built by tether, inserted by hand
        rows = [bare_row(c.queue.build(p)) for p in payloads]
    conn = bare_connect(directory / "bare" / "ledger.db")
    t_out: list[float] = []
    b_out: list[float] = []

    def tether_one(i: int) -> None:
        t0 = time.perf_counter()
        c.enqueue(payloads[i])
        t_out.append(time.perf_counter() - t0)

    def bare_one(i: int) -> None:
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(BARE_INSERT, rows[i])
        conn.execute("COMMIT")
        b_out.append(time.perf_counter() - t0)

    try:
        with open_ledger(directory / "tether") as c:
            for i in range(n):
                first, second = (tether_one, bare_one) if i % 2 == 0 else (bare_one, tether_one)
                first(i)
                second(i)
    finally:
        conn.close()
    return t_out, b_out


# -- (b) drain of no-op jobs, (c) create_file jobs ------------------------------------------------


def _count_completed(db: Path) -> int:
    conn = bare_connect(db)
    try:
        return conn.execute("SELECT count(*) FROM tether_jobs WHERE status = 'completed'").fetchone()[0]
    finally:
        conn.close()


def tether_drain(c: Coordinator, payloads: list[Payload], worker_options: dict[str, Any]) -> float:
    """Seconds for one worker thread to run ``payloads`` (enqueued untimed first)."""
    c.enqueue_many(payloads)
    worker = c.worker(threads=1, **worker_options)
    t0 = time.perf_counter()
    ran = worker.run_until_idle()
    elapsed = time.perf_counter() - t0
    if ran != len(payloads):
        raise RuntimeError(f"tether ran {ran} of {len(payloads)} jobs")
    return elapsed


def bare_drain(c: Coordinator, payloads: list[Payload], handle: Callable[[str, str], str | None]) -> float:
    """Seconds for the bare loop to run ``payloads``: claim commit, ``handle``, complete commit."""
    c.enqueue_many(payloads)  # the same rows, written by tether, untimed
    conn = bare_connect(Path(c.engine.url.database))
    done = 0
    try:
        t0 = time.perf_counter()
        while (job := bare_claim(conn, "bare-worker")) is not None:
            job_id, attempts, payload = job
            bare_complete(conn, "bare-worker", job_id, attempts, handle(job_id, payload))
            done += 1
        elapsed = time.perf_counter() - t0
    finally:
        conn.close()
    if done != len(payloads):
        raise RuntimeError(f"bare loop ran {done} of {len(payloads)} jobs")
    return elapsed


def drain_pair(
    directory: Path,
    n: int,
    make: Callable[[int], Payload],
    handle: Callable[[Path], Callable[[str, str], str | None]],
    *,
    tether_first: bool,
    worker_options: dict[str, Any],
) -> tuple[float, float]:
    """Jobs/s of tether and of the bare loop, each given ``n`` jobs on a fresh ledger (enqueued
    untimed with ``enqueue_many``) and timed until its queue is empty."""
    t_dir, b_dir = directory / "tether", directory / "bare"
    t_root, b_root = _prepare_root(t_dir), _prepare_root(b_dir)
    payloads = [make(i) for i in range(n)]
    times: dict[str, float] = {}
    with open_ledger(t_dir) as tc, open_ledger(b_dir) as bc:
        for side in ("tether", "bare") if tether_first else ("bare", "tether"):
            if side == "tether":
                times[side] = tether_drain(tc, payloads, worker_options)
            else:
                times[side] = bare_drain(bc, payloads, handle(b_root))
    for d in (t_dir, b_dir):
        if _count_completed(d / "ledger.db") != n:
            raise RuntimeError(f"not every job in {d} completed")
    if payloads[0].job_type == "create_file":
        for root in (t_root, b_root):
            _check_files(root, n)
    return n / times["tether"], n / times["bare"]


def _noop_handler(_root: Path) -> Callable[[str, str], str | None]:
    return lambda _id, _payload: None


def _file_handler(root: Path) -> Callable[[str, str], str | None]:
    """The bare create_file: render, temp write + fsync, rename, fsync dir; no path checks, no lock."""

    def handle(job_id: str, payload: str) -> str:
        body = orjson.loads(payload)
        data = orjson.dumps(body["content"], option=orjson.OPT_INDENT_2) + b"\n"
        target = os.path.join(root, body["path"])
        _common.write_replace(f"{target}.{job_id}.tmp", target, data)
        return orjson.dumps({"bytes": len(data)}).decode()

    return handle


def _prepare_root(directory: Path) -> Path:
    root = directory / "data"
    for d in range(FILE_DIRS):
        (root / f"d{d:02d}").mkdir(parents=True, exist_ok=True)
    return root


def _check_files(root: Path, n: int) -> None:
    for i in (0, n // 2, n - 1):
        p = note(i)
        if (root / p.path).read_bytes() != render(p):
            raise RuntimeError(f"{p.path} does not hold the intended bytes")
    written = sum(1 for d in range(FILE_DIRS) for e in os.scandir(root / f"d{d:02d}") if e.name.endswith(".json"))
    if written != n:
        raise RuntimeError(f"{written} files written, expected {n}")


# -- running and reporting ---------------------------------------------------------------------


def measure(base: Path, args: argparse.Namespace, *, quiet: bool = False) -> dict[str, dict[str, list[Any]]]:
    results: dict[str, dict[str, list[Any]]] = {
        f: {"tether": [], "bare": []} for f in ("enqueue", "drain", "create_file")
    }

    def keep(fig: str, pair: tuple[Any, Any]) -> None:
        results[fig]["tether"].append(pair[0])
        results[fig]["bare"].append(pair[1])

    for r in range(args.runs):
        with scratch(base, "enqueue") as d:
            keep("enqueue", enqueue_pair(d, args.samples))
        # The side that drains first alternates from run to run (and between the two figures).
        with scratch(base, "drain") as d:
            keep(
                "drain",
                drain_pair(
                    d,
                    args.jobs,
                    lambda i: Noop(n=i),
                    _noop_handler,
                    tether_first=r % 2 == 0,
                    worker_options=args.worker,
                ),
            )
        with scratch(base, "create_file") as d:
            keep(
                "create_file",
                drain_pair(d, args.files, note, _file_handler, tether_first=r % 2 == 1, worker_options=args.worker),
            )
        if not quiet:
            print(f"  run {r + 1}/{args.runs} done", file=sys.stderr, flush=True)
    return results


def table(results: dict[str, dict[str, list[Any]]]) -> str:
    rows = []

    def add(
        name: str, t_runs: list[float], b_runs: list[float], fmt: str, target: str, ok: Callable[[float], bool]
    ) -> None:
        t, b = median(t_runs), median(b_runs)
        ratio = t / b
        per_run = [x / y for x, y in zip(t_runs, b_runs, strict=True)]
        rows.append(
            (
                name,
                format(t, fmt),
                format(b, fmt),
                f"{ratio:.2f}x",
                f"{min(per_run):.2f}-{max(per_run):.2f}",
                target,
                "-" if not target else ("yes" if ok(ratio) else "NO"),
            )
        )

    enq = results["enqueue"]
    for q, label, target in ((0.5, "p50", ""), (0.95, "p95", "<= 1.50x")):
        add(
            f"(a) enqueue latency {label}, ms",
            [percentile(s, q) * 1e3 for s in enq["tether"]],
            [percentile(s, q) * 1e3 for s in enq["bare"]],
            ".3f",
            target,
            lambda x: x <= 1.5,
        )
    add(
        "(b) drain no-op, 1 thread, jobs/s",
        results["drain"]["tether"],
        results["drain"]["bare"],
        ",.0f",
        ">= 0.50x",
        lambda x: x >= 0.5,
    )
    add(
        "(c) create_file, 1 thread, jobs/s",
        results["create_file"]["tether"],
        results["create_file"]["bare"],
        ",.0f",
        ">= 0.70x",
        lambda x: x >= 0.7,
    )
    head = ("figure", "tether", "bare", "tether/bare", "per-run range", "target", "met")
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    right = {1, 2, 3, 4}

    def line(r: tuple[str, ...]) -> str:
        cells = [
            str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        return "| " + " | ".join(cells) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if i in right else "-" * w for i, w in enumerate(widths)) + " |"
    return "\n".join([line(head), sep, *(line(r) for r in rows)])


def profile(base: Path, n: int, top: int, options: dict[str, Any]) -> None:
    """The tether side of each figure under cProfile. Drains call ``run_once`` in this thread
    (cProfile sees only its own thread); that is the same per-job path as the worker thread."""
    for fig in ("enqueue", "drain", "create_file"):
        with scratch(base, f"profile-{fig}") as d:
            c = open_ledger(d)
            if fig == "enqueue":
                payloads = [note(i) for i in range(n)]
                body: Callable[[], Any] = lambda c=c, payloads=payloads: [c.enqueue(p) for p in payloads]  # noqa: E731 (one name for either body)
            else:
                _prepare_root(d)
                c.enqueue_many([Noop(n=i) for i in range(n)] if fig == "drain" else [note(i) for i in range(n)])
                w = c.worker(threads=1, **options)
                body = lambda w=w: [None for _ in iter(w.run_once, 0)]  # noqa: E731 (as above)
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.runcall(body)
            wall = time.perf_counter() - t0
            c.close()
        out = base / f"profile-{fig}.prof"
        prof.dump_stats(out)
        print(f"\n## profile: tether {fig}, {n} jobs, {wall:.2f} s under cProfile ({out})")
        pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(top)


def _worker_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (a WorkerConfig field), got {text!r}")
    try:
        return key, orjson.loads(value)
    except orjson.JSONDecodeError:
        return key, value


def tether_source() -> str:
    """Which tether was measured: its directory and, for this checkout, the commit (+ dirty)."""
    import subprocess

    import tether

    where = Path(tether.__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True
        ).stdout.strip()
        return f"{where} at {rev}{' + uncommitted changes' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return f"{where} (not a git checkout)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2000, help="no-op jobs drained per side per run (default 2000)")
    ap.add_argument("--files", type=int, default=None, help="create_file jobs per side per run (default --jobs / 4)")
    ap.add_argument("--samples", type=int, default=None, help="single enqueues per side per run (default --jobs / 2)")
    ap.add_argument("--runs", type=int, default=3, help="runs; every figure is the median over runs (default 3)")
    ap.add_argument(
        "--worker",
        type=_worker_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a WorkerConfig field for tether's worker, e.g. --worker batch=1 (repeatable)",
    )
    ap.add_argument("--dir", type=Path, default=SCRATCH, help="scratch directory (default .bench/ in the repo)")
    ap.add_argument("--profile", action="store_true", help="then profile tether's side of each figure")
    ap.add_argument("--top", type=int, default=25, help="functions listed per profile (default 25)")
    args = ap.parse_args(argv)
    args.files = args.files or max(10, args.jobs // 4)
    args.samples = args.samples or max(10, args.jobs // 2)
    args.worker = dict(args.worker)
    if min(args.jobs, args.files, args.samples) < 10 or args.runs < 1:
        ap.error("--jobs, --files and --samples must be >= 10, --runs >= 1")
    base = args.dir.resolve()

    with scratch(base, "plan") as d:
        open_ledger(d).close()
        plan = check_bare_claim_plan(d / "ledger.db")
    started = datetime.now(UTC)
    print(f"tether core benchmark, {started:%Y-%m-%d %H:%M} UTC", flush=True)
    print(f"machine: {machine()}, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"tether: {tether_source()}; worker options: {args.worker or 'defaults'}, 1 thread")
    print(
        f"scratch: {base} (both sides); WAL + synchronous=FULL; {args.runs} runs, medians; per run "
        f"{args.samples} single enqueues per side (alternating one by one), {args.jobs} no-op and "
        f"{args.files} create_file jobs per side (enqueued first, then drained; the side going first alternates)"
    )
    print(f"bare claim plan: {plan}\n", flush=True)
    t0 = time.perf_counter()
    warm = argparse.Namespace(runs=1, samples=20, jobs=40, files=40, worker=args.worker)
    measure(base, warm, quiet=True)  # imports, statement caches, page cache
    results = measure(base, args)
    print(table(results))
    print(
        "\nratios are tether/bare: for latency lower is better, for jobs/s higher is better;"
        " per-run range = min-max of the per-run ratios"
    )
    print(
        f"measured in {time.perf_counter() - t0:.0f} s, load average now "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    if args.profile:
        profile(base, args.files, args.top, args.worker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
