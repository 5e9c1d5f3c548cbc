"""Issue 7: tether next to the queues people would pick instead, at full durability.

    bash benchmarks/bench_env.sh                      # .bench/venv-anchors: huey, persist-queue, litequeue
    .bench/venv-anchors/bin/python benchmarks/anchors.py [--jobs 20000] [--enqueues 2000] [--runs 3]

Same disk (.bench/), WAL + synchronous=FULL everywhere (set explicitly; each anchor's setting is
read back and checked), every system measured in every run, in an order that rotates from run to
run; single enqueues rotate across the systems one job at a time. Figures are medians over runs;
ratios are taken per run (same run, same load) and their median reported. Wall time and this
process's CPU time (time.process_time) are both kept: the machine is shared.

Figures: durable single enqueue (jobs/s, p50/p95 latency); bulk enqueue of 10,000 jobs in one
call; drain of no-op jobs by one worker; create_file against a bare loop with the same batching;
drain with 1,000,000 completed rows in the table against an empty table. Pickup latency and idle
CPU are in pickup.py.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import (
    BARE_CLAIM_N,
    BARE_INSERT,
    SCRATCH,
    bare_connect,
    bare_row,
    machine,
    median,
    percentile,
    scratch,
    sqlite_now,
    sqlite_time,
)
from core import (
    BARE_COMPLETE,
    Noop,
    _check_files,
    _file_handler,
    _prepare_root,
    bare_claim,
    bare_complete,
    note,
    open_ledger,
    profile,
    tether_source,
)
from tether.ledger.ids import new_id

FULL = 2  # PRAGMA synchronous value


def _check_full(conn: sqlite3.Connection, who: str) -> None:
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    if mode != "wal" or sync != FULL:
        raise RuntimeError(f"{who} is not WAL + FULL: journal_mode={mode}, synchronous={sync}")


# -- the anchors, each opened at WAL + synchronous=FULL -------------------------------------------


def open_huey(d: Path) -> tuple[Any, Any]:
    """SqliteHuey: WAL is its default; fsync=True makes it set synchronous=2 (FULL)."""
    from huey import SqliteHuey

    huey = SqliteHuey(name="bench", filename=str(d / "huey.db"), fsync=True)

    @huey.task()
    def noop(n: int) -> None:
        return None

    _check_full(huey.storage.conn, "huey")
    return huey, noop


def open_pq(d: Path) -> Any:
    """persist-queue SQLiteAckQueue sets WAL and leaves synchronous at SQLite's default; we set FULL."""
    from persistqueue import SQLiteAckQueue

    q = SQLiteAckQueue(str(d / "pq"), auto_commit=True, multithreading=False)
    q._conn.execute("PRAGMA synchronous=FULL")  # _getter and _putter are this one connection
    _check_full(q._conn, "persist-queue")
    return q


def open_lq(d: Path) -> Any:
    """litequeue sets synchronous=NORMAL in its constructor; we set FULL on its connection after."""
    from litequeue import LiteQueue

    q = LiteQueue(str(d / "lq.db"))
    q.conn.execute("PRAGMA synchronous=FULL")
    _check_full(q.conn, "litequeue")
    return q


class Bare:
    """BEGIN IMMEDIATE + INSERT + COMMIT on tether's table, rows built by tether beforehand."""

    def __init__(self, d: Path) -> None:
        open_ledger(d).close()  # tether's DDL
        self.conn = bare_connect(d / "ledger.db")
        self._c = open_ledger(Path(d) / "builder")

    def row(self, p: Any) -> tuple[Any, ...]:
        return bare_row(self._c.queue.build(p))

    def insert(self, row: tuple[Any, ...]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(BARE_INSERT, row)
        self.conn.execute("COMMIT")

    def build_and_insert(self, payload: Any) -> None:
        """The same INSERT + commit with the row made at call time, as any enqueue must: a ULID,
        the time, the payload's JSON (tether's own helpers, no validation or options)."""
        now = datetime.now(UTC)
        when = sqlite_time(now)
        body = payload.to_json().decode()
        self.insert((new_id(now), payload.job_type, body, 0, 3, when, when, None, None, None, None, len(body)))


# -- durable single enqueue ----------------------------------------------------------------------

# "bare+build" is a diagnostic, not an anchor: bare with its row made at call time (see Bare).
ENQ_SYSTEMS = ("huey", "persist-queue", "litequeue", "bare", "bare+build", "tether")


def enqueue_round(d: Path, n: int) -> dict[str, list[float]]:
    """Latencies of ``n`` single durable enqueues per system, rotating across the systems job by job."""
    huey, noop = open_huey(d)
    pq, lq, bare, built = open_pq(d), open_lq(d), Bare(d / "bare"), Bare(d / "bare-build")
    tc = open_ledger(d / "tether")
    payloads = [Noop(n=i) for i in range(n)]
    bare_rows = [bare.row(p) for p in payloads]
    ops: dict[str, Callable[[int], Any]] = {
        "huey": lambda i: noop(i),
        "persist-queue": lambda i: pq.put({"n": i}),
        "litequeue": lambda i: lq.put(f'{{"n": {i}}}'),
        "bare": lambda i: bare.insert(bare_rows[i]),
        "bare+build": lambda i: built.build_and_insert(payloads[i]),
        "tether": lambda i: tc.enqueue(payloads[i]),
    }
    out: dict[str, list[float]] = {s: [] for s in ENQ_SYSTEMS}
    try:
        for i in range(n):
            k = i % len(ENQ_SYSTEMS)
            for s in ENQ_SYSTEMS[k:] + ENQ_SYSTEMS[:k]:
                t0 = time.perf_counter()
                ops[s](i)
                out[s].append(time.perf_counter() - t0)
    finally:
        pq.close(), lq.close(), bare.conn.close(), built.conn.close(), tc.close(), huey.storage.close()
    return out


def bulk_round(d: Path, n: int, calls: int = 3) -> dict[str, float]:
    """Jobs/s of one ``enqueue_many`` of ``n`` jobs, and of one bare executemany in one
    transaction: the median of ``calls`` of each, alternating, each into a fresh ledger (one
    call is ~0.1 s, about the length of a garbage collection or a neighbour's burst)."""
    payloads = [Noop(n=i) for i in range(n)]
    out: dict[str, list[float]] = {"tether": [], "bare": []}
    for k in range(calls):
        bare = Bare(d / f"bare{k}")
        rows = [bare.row(p) for p in payloads]
        with open_ledger(d / f"tether{k}") as c:
            t0 = time.perf_counter()
            c.enqueue_many(payloads)
            out["tether"].append(n / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        bare.conn.execute("BEGIN IMMEDIATE")
        bare.conn.executemany(BARE_INSERT, rows)
        bare.conn.execute("COMMIT")
        out["bare"].append(n / (time.perf_counter() - t0))
        bare.conn.close()
    return {side: median(v) for side, v in out.items()}


# -- drains: each function enqueues untimed, then returns (wall s, cpu s) of draining n jobs -------


def _timed(body: Callable[[], int], n: int, who: str) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    done = body()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if done != n:
        raise RuntimeError(f"{who} ran {done} of {n} jobs")
    return wall, cpu


def drain_huey(d: Path, n: int) -> tuple[float, float]:
    huey, noop = open_huey(d)
    for i in range(n):
        noop(i)

    def body() -> int:
        done = 0
        while (task := huey.dequeue()) is not None:
            huey.execute(task)
            done += 1
        return done

    return _timed(body, n, "huey")


def drain_pq(d: Path, n: int) -> tuple[float, float]:
    from persistqueue import Empty

    q = open_pq(d)
    for i in range(n):
        q.put({"n": i})

    def body() -> int:
        done = 0
        while True:
            try:
                item = q.get(block=False, raw=True)
            except Empty:
                return done
            q.ack(id=item["pqid"])
            done += 1

    return _timed(body, n, "persist-queue")


def drain_lq(d: Path, n: int) -> tuple[float, float]:
    q = open_lq(d)
    with q.transaction(mode="IMMEDIATE"):  # setup only: one commit for all puts
        for i in range(n):
            q.put(f'{{"n": {i}}}')

    def body() -> int:
        done = 0
        while (m := q.pop()) is not None:
            q.done(m.message_id)
            done += 1
        return done

    return _timed(body, n, "litequeue")


def bare_loop(db: Path, batch: int, handle: Callable[[str, str], str | None]) -> int:
    """Claim ``batch`` per commit, ``handle`` each, complete them in one commit (batch=1: the
    claim-commit + complete-commit loop of issue 2)."""
    conn, done = bare_connect(db), 0
    try:
        while True:
            if batch == 1:
                job = bare_claim(conn, "bare")
                if job is None:
                    return done
                bare_complete(conn, "bare", job[0], job[1], handle(job[0], job[2]))
                done += 1
                continue
            now = sqlite_now()
            conn.execute("BEGIN IMMEDIATE")
            jobs = conn.execute(BARE_CLAIM_N, ("bare", now, now, now, batch)).fetchall()
            conn.execute("COMMIT")
            if not jobs:
                return done
            results = [(sqlite_now(), handle(i, p), i, "bare", a) for i, a, p in jobs]
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(BARE_COMPLETE, results)
            conn.execute("COMMIT")
            done += len(jobs)
    finally:
        conn.close()


def drain_bare(
    d: Path,
    n: int,
    batch: int,
    make: Callable[[int], Any] = lambda i: Noop(n=i),
    handle: Callable[[str, str], str | None] = lambda _i, _p: None,
) -> tuple[float, float]:
    with open_ledger(d) as c:
        c.enqueue_many([make(i) for i in range(n)])
    return _timed(lambda: bare_loop(d / "ledger.db", batch, handle), n, f"bare batch={batch}")


def drain_tether(
    d: Path, n: int, make: Callable[[int], Any] = lambda i: Noop(n=i), **options: Any
) -> tuple[float, float]:
    c = open_ledger(d)
    c.enqueue_many([make(i) for i in range(n)])
    try:
        w = c.worker(threads=1, **options)
        return _timed(lambda: w.run_until_idle(install_signals=False), n, f"tether {options}")
    finally:
        c.close()


DRAINS: dict[str, Callable[[Path, int], tuple[float, float]]] = {
    "huey": drain_huey,
    "persist-queue": drain_pq,
    "litequeue": drain_lq,
    "bare 1/commit": lambda d, n: drain_bare(d, n, 1),
    "bare 100/commit": lambda d, n: drain_bare(d, n, 100),
    "tether (default batch 100)": lambda d, n: drain_tether(d, n),
    "tether batch=32": lambda d, n: drain_tether(d, n, batch=32),
}


def files_pair(d: Path, n: int, batch: int, tether_first: bool, rounds: int = 8) -> dict[str, float]:
    """create_file jobs/s: tether's worker against the bare loop claiming/completing ``batch`` per
    commit. The sides alternate in ``rounds`` rounds of n/rounds jobs each (fresh ledger and data
    root per round): creating a file on this disk costs 0.01 ms in some minutes and 0.6-1.1 ms in
    others, and rounds of a second or less give both sides the same minutes."""
    per = max(1, n // rounds)
    wall = {"tether": 0.0, "bare": 0.0}
    for k in range(rounds):
        for side in ("tether", "bare") if tether_first == (k % 2 == 0) else ("bare", "tether"):
            where = d / f"{side}{k}"
            root = _prepare_root(where)
            if side == "tether":
                wall[side] += drain_tether(where, per, note, batch=batch)[0]
            else:
                wall[side] += drain_bare(where, per, batch, note, _file_handler(root))[0]
            _check_files(root, per)
    return {side: per * rounds / w for side, w in wall.items()}


# -- scale: 1,000,000 completed rows already in the table -----------------------------------------


def fill_completed(db: Path, rows: int) -> None:
    """Insert ``rows`` completed no-op jobs with plain sqlite3 into tether's table (ULIDs, times
    in the past), at synchronous=OFF: this is setup, not a measurement."""
    from ulid import ULID

    start = datetime.now(UTC) - timedelta(days=30)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    sql = """INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts, created_at,
             claimed_at, completed_at, run_at, result)
             VALUES (?, 'bench_noop', ?, 'completed', 0, 1, 3, ?, ?, ?, ?, NULL)"""
    step = 20_000
    for lo in range(0, rows, step):
        batch = []
        for i in range(lo, min(rows, lo + step)):
            t = start + timedelta(milliseconds=i)
            ts = sqlite_time(t)
            batch.append((str(ULID.from_datetime(t)), f'{{"n":{i}}}', ts, ts, ts, ts))
        conn.execute("BEGIN")
        conn.executemany(sql, batch)
        conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


# -- running and reporting ---------------------------------------------------------------------


def _med_ratio(a: list[float], b: list[float]) -> float:
    return median([x / y for x, y in zip(a, b, strict=True)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000, help="no-op jobs per drain per system per run")
    ap.add_argument("--enqueues", type=int, default=20_000, help="single enqueues per system per run")
    ap.add_argument("--bulk", type=int, default=10_000, help="jobs in the one enqueue_many call")
    ap.add_argument("--files", type=int, default=2_000, help="create_file jobs per side per run")
    ap.add_argument("--scale-rows", type=int, default=1_000_000, help="completed rows for the scale figure")
    ap.add_argument("--scale-jobs", type=int, default=None, help="jobs drained per side for scale (default --jobs)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="enqueue,bulk,drain,files,scale", help="comma-separated figures")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="then cProfile tether with N jobs")
    ap.add_argument("--dir", type=Path, default=SCRATCH)
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    base = args.dir.resolve()
    scale_jobs = args.scale_jobs or args.jobs
    print(f"issue 7 anchors benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    import importlib.metadata as md

    print("versions: " + ", ".join(f"{p} {md.version(p)}" for p in ("huey", "persist-queue", "litequeue")))
    print(f"tether: {tether_source()}")
    print(
        f"scratch {base}; WAL + synchronous=FULL for all; {args.runs} runs; enqueues {args.enqueues}/system/run, "
        f"drain {args.jobs} jobs, bulk {args.bulk}, files {args.files}, "
        f"scale {args.scale_rows:,} rows + {scale_jobs} jobs",
        flush=True,
    )
    R: dict[str, list[Any]] = {}

    def keep(key: str, value: Any) -> None:
        R.setdefault(key, []).append(value)

    big = None
    if "scale" in only:
        big_dir = base / "scale-1m"
        big = big_dir / "ledger.db"
        if big_dir.exists():
            import shutil

            shutil.rmtree(big_dir)
        t0 = time.perf_counter()
        open_ledger(big_dir).close()
        fill_completed(big, args.scale_rows)
        print(
            f"  filled {args.scale_rows:,} completed rows in {time.perf_counter() - t0:.0f} s "
            f"({big.stat().st_size / 1e6:.0f} MB)",
            flush=True,
        )
    for r in range(args.runs):
        t_run = time.perf_counter()
        if "enqueue" in only:
            with scratch(base, "enq") as d:
                for s, lat in enqueue_round(d, args.enqueues).items():
                    keep(f"enq {s}", lat)
        if "bulk" in only:
            with scratch(base, "bulk") as d:
                for s, v in bulk_round(d, args.bulk).items():
                    keep(f"bulk {s}", v)
        if "drain" in only:
            names = list(DRAINS)
            k = r % len(names)
            for s in names[k:] + names[:k]:
                with scratch(base, "drain") as d:
                    wall, cpu = DRAINS[s](d, args.jobs)
                keep(f"drain {s}", (args.jobs / wall, args.jobs / cpu))
        if "files" in only:
            with scratch(base, "files") as d:
                for s, v in files_pair(d, args.files, 32, tether_first=r % 2 == 0).items():
                    keep(f"files {s}", v)
        if "scale" in only:
            order = ("empty", "1m") if r % 2 == 0 else ("1m", "empty")
            for s in order:
                if s == "1m":
                    c = open_ledger(big.parent)
                    c.enqueue_many([Noop(n=i) for i in range(scale_jobs)])
                    w = c.worker(threads=1)
                    wall, _ = _timed(lambda w=w: w.run_until_idle(install_signals=False), scale_jobs, "tether 1m")
                    c.close()
                else:
                    with scratch(base, "scale-empty") as d:
                        wall, _ = drain_tether(d, scale_jobs)
                keep(f"scale {s}", scale_jobs / wall)
        print(
            f"  run {r + 1}/{args.runs} done in {time.perf_counter() - t_run:.0f} s, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    print()
    print(report(R, args))
    print(f"\nload average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if big is not None:
        import shutil

        shutil.rmtree(big.parent, ignore_errors=True)
    if args.profile:
        profile(base, args.profile, 20, {})  # core.py: single enqueue, drain (run_once), create_file
        profile_bulk(base, args.bulk)
    return 0


def profile_bulk(base: Path, n: int) -> None:
    import cProfile
    import pstats

    payloads = [Noop(n=i) for i in range(n)]
    with scratch(base, "profile-bulk") as d, open_ledger(d) as c:
        prof = cProfile.Profile()
        prof.runcall(c.enqueue_many, payloads)
    print(f"\n## profile: tether enqueue_many of {n} jobs")
    pstats.Stats(prof).strip_dirs().sort_stats("tottime").print_stats(20)


def report(R: dict[str, list[Any]], args: argparse.Namespace) -> str:
    rows: list[tuple[str, ...]] = []

    def row(fig: str, value: str, vs: str = "", target: str = "", ok: bool | None = None) -> None:
        rows.append((fig, value, vs, target, "-" if ok is None else ("PASS" if ok else "FAIL")))

    if "enq tether" in R:
        for s in ENQ_SYSTEMS:
            lat = R[f"enq {s}"]
            rate = median([len(x) / sum(x) for x in lat])
            p50, p95 = median([percentile(x, 0.5) * 1e3 for x in lat]), median([percentile(x, 0.95) * 1e3 for x in lat])
            vs = ""
            if s != "tether":
                t = R["enq tether"]
                vs = (
                    f"tether/{s}: "
                    f"rate {_med_ratio([len(x) / sum(x) for x in t], [len(x) / sum(x) for x in lat]):.2f}x, "
                    f"p95 {_med_ratio([percentile(x, 0.95) for x in t], [percentile(x, 0.95) for x in lat]):.2f}x"
                )
            ok = None
            target = ""
            if s == "bare":
                ratio = _med_ratio([percentile(x, 0.95) for x in R["enq tether"]], [percentile(x, 0.95) for x in lat])
                target, ok = "tether p95 <= 1.2x bare", ratio <= 1.2
            row(f"single enqueue: {s}", f"{rate:,.0f} jobs/s, p50 {p50:.2f} ms, p95 {p95:.2f} ms", vs, target, ok)
    if "bulk tether" in R:
        t, b = median(R["bulk tether"]), median(R["bulk bare"])
        row(
            f"bulk enqueue {args.bulk:,} in one call: tether",
            f"{t:,.0f} jobs/s",
            f"bare executemany {b:,.0f}/s, tether/bare {_med_ratio(R['bulk tether'], R['bulk bare']):.2f}x",
            ">= 100,000 jobs/s",
            t >= 100_000,
        )
    if "drain huey" in R:
        for s in DRAINS:
            v = R[f"drain {s}"]
            wall, cpu = [x[0] for x in v], [x[1] for x in v]
            vs, target, ok = "", "", None
            if s.startswith("tether"):
                parts = [
                    f"/{a.split()[0]} {_med_ratio(wall, [x[0] for x in R[f'drain {a}']]):.2f}x"
                    for a in ("huey", "persist-queue", "litequeue", "bare 1/commit", "bare 100/commit")
                ]
                vs = "tether" + ", ".join(parts)
                vs = vs.replace("/bare ", "/bare1 ", 1).replace("/bare ", "/bare100 ", 1)
                if s == "tether (default batch 100)":  # the target is on the defaults
                    ratio = _med_ratio(wall, [x[0] for x in R["drain huey"]])
                    target, ok = ">= 5x huey", ratio >= 5
            row(f"drain no-op: {s}", f"{median(wall):,.0f} jobs/s (per CPU-s {median(cpu):,.0f})", vs, target, ok)
    if "files tether" in R:
        ratio = _med_ratio(R["files tether"], R["files bare"])
        row(
            "create_file: tether (batch 32)",
            f"{median(R['files tether']):,.0f} jobs/s",
            f"bare 32/commit {median(R['files bare']):,.0f}/s, tether/bare {ratio:.2f}x",
            ">= 0.80x bare",
            ratio >= 0.8,
        )
    if "scale 1m" in R:
        ratio = _med_ratio(R["scale empty"], R["scale 1m"])
        row(
            f"drain with {args.scale_rows:,} completed rows",
            f"{median(R['scale 1m']):,.0f} jobs/s",
            f"empty table {median(R['scale empty']):,.0f}/s, empty/1M {ratio:.2f}x",
            "<= 1.2x",
            ratio <= 1.2,
        )
    head = ("figure", "median", "ratios (median of per-run ratios)", "target", "met")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in (head, *rows)]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
