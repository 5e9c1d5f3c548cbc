"""A hot target (issue 23): one worker thread drains n no-op jobs whose ordering key spreads them
over K targets (job i on target i mod K; "none": no target), SQLite with full durability.

    .venv/bin/python benchmarks/hot_target.py [--before SRC] [--after SRC] [--rounds 3] [--cap 150]

Each figure is jobs/s of ``worker(threads=1).run_until_idle()`` over jobs enqueued beforehand
(``enqueue_many``, untimed) on a fresh ledger, run in a new interpreter per measurement. With
``--before`` (another checkout's ``src/``, put first on ``PYTHONPATH``) every figure is measured on
both sides, alternating which goes first from round to round; medians over rounds. A drain still
running after ``--cap`` seconds is stopped (the worker finishes its batch) and its rate is over
the jobs it ran, marked ``*``: a capped drain ran while the backlog was at its largest. The CPU
time a job is the process's, split into user and system time (``os.times``): the system time is
mostly the commits' writes and fsyncs.

``--sql SQL`` adds a third side, ``after+sql``: the after tree with ``SQL`` run on each ledger
(one ``executescript``) once it is open and before the jobs go in, to price a piece of the schema
on the same drains (``--sql "DROP TRIGGER tether_targets_on_update"``: the targets table's upkeep
at each completion).

Also printed per side: ``observe.stats`` (what ``tether status`` reads) on the 100,000-job ledger
with one target, before the drain, median of 5 after one untimed call.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _common
from _common import SCRATCH, machine, scratch

# (jobs, targets or None, worker batch): the table
CELLS: list[tuple[int, int | None, int]] = [
    (20_000, None, 100),
    (20_000, 10_000, 100),
    (20_000, 100, 100),
    (20_000, 5, 100),
    (20_000, 1, 100),
    (2_000, 1, 100),
    (2_000, 1, 1),
    (100_000, 1, 100),
    (2_000, None, 1),  # one job per commit without a target: tether's own serial path
]
BARE_COMMITS = 2_000


def bare_commits(n: int) -> dict[str, Any]:
    """The disk's serial limit: commits/s of a bare sqlite3 loop, each a one-row UPDATE in its own
    BEGIN IMMEDIATE ... COMMIT (WAL, synchronous=FULL, as tether's)."""
    from _common import bare_connect

    with scratch(SCRATCH, "hot-target-bare") as tmp:
        conn = bare_connect(tmp / "bare.db")
        try:
            conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER)")
            conn.executemany("INSERT INTO t VALUES (?, 0)", [(i,) for i in range(n)])
            t0 = time.perf_counter()
            for i in range(n):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE t SET n = n + 1 WHERE id = ?", (i,))
                conn.execute("COMMIT")
            elapsed = time.perf_counter() - t0
        finally:
            conn.close()
    return {
        "rate": n / elapsed,
        "cpu_us": None,
        "ran": n,
        "capped": False,
        "stats_ms": None,
        "src": None,
        "user_us": None,
        "sys_us": None,
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement, in this process (which imports tether from PYTHONPATH)."""
    import tether
    from hot_jobtypes import hot_noop
    from tether import Coordinator
    from tether.jobtypes import default_registry
    from tether.observe.health import stats as observe_stats

    HotNoop, HotNoopType = hot_noop()

    if "bare" in spec:
        return bare_commits(spec["bare"])
    n, keys, batch, cap = spec["jobs"], spec["keys"], spec["batch"], spec["cap"]
    registry = default_registry()
    registry.register(HotNoopType())
    with scratch(SCRATCH, "hot-target") as tmp:
        url = f"sqlite:///{tmp}/ledger.db"
        with Coordinator.open(url, root=tmp / "data", registry=registry, durability="full") as c:
            if spec.get("sql"):
                # A connection of its own: the coordinator has recorded the schema as ensured,
                # so nothing puts back what the script drops.
                with contextlib.closing(sqlite3.connect(tmp / "ledger.db")) as raw:
                    raw.executescript(spec["sql"])
            c.enqueue_many([HotNoop(n=i, key=None if keys is None else f"k{i % keys}") for i in range(n)])
            stats_ms = None
            if spec.get("stats"):
                stats_ms = _common.median_ms(lambda: observe_stats(c.engine), 5)
            worker = c.worker(threads=1, batch=batch)
            timer = threading.Timer(cap, worker.stop)
            timer.start()
            t0, cpu0, times0 = time.perf_counter(), time.process_time(), os.times()
            ran = worker.run_until_idle(install_signals=False)
            elapsed, cpu, times = time.perf_counter() - t0, time.process_time() - cpu0, os.times()
            timer.cancel()
    return {
        "rate": ran / elapsed,
        "cpu_us": cpu / ran * 1e6,
        "user_us": (times.user - times0.user) / ran * 1e6,
        "sys_us": (times.system - times0.system) / ran * 1e6,
        "ran": ran,
        "capped": ran < n,
        "stats_ms": stats_ms,
        "src": str(Path(tether.__file__).parent),
    }


def measure(src: Path, spec: dict[str, Any]) -> dict[str, Any]:
    return _common.run_child(__file__, src, spec)


def label(keys: int | None, batch: int) -> str:
    return ("K = none" if keys is None else f"K = {keys:,}") + (f", batch={batch}" if batch != 100 else "")


def print_round_ratios(
    results: dict[tuple[str, int, int | None, int], list[dict[str, Any]]],
    others: list[str],
    cells: list[tuple[int, int | None, int]],
) -> None:
    """Per case and side, each round's jobs/s over before's in the same round: their median with a
    90 % bootstrap interval. A round's two drains run minutes apart at most, so the pairs carry
    less of the disk's drift than the medians of each side do."""
    for jobs, keys, batch in cells:
        before = [x["rate"] for x in results[("before", jobs, keys, batch)]]
        for side in others:
            ratios = [x["rate"] / b for x, b in zip(results[(side, jobs, keys, batch)], before, strict=True)]
            mid, low, high = _common.median_interval(ratios)
            print(
                f"{jobs:,} {label(keys, batch)}, {side}/before by round: median {mid:.3f}"
                f" (90 % interval {low:.3f}-{high:.3f}; rounds {min(ratios):.2f}-{max(ratios):.2f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.tree_options(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cap", type=float, default=600.0, help="seconds a drain may run (default 600)")
    parser.add_argument("--cap-before", type=float, help="seconds a drain of --before may run (default: --cap)")
    parser.add_argument("--only", help="only the cases with this K (e.g. none, 1), with --jobs")
    parser.add_argument("--jobs", type=int, help="only the cases with this many jobs")
    parser.add_argument("--sql", help="also measure the after tree with this SQL run on each ledger (side after+sql)")
    args = parser.parse_args()
    trees = _common.trees_or_child(args, child)
    if trees is None:
        return
    if args.sql:
        trees["after+sql"] = trees["after"]
    cells = [
        (jobs, keys, batch)
        for jobs, keys, batch in CELLS
        if (args.only is None or args.only == ("none" if keys is None else str(keys)))
        and (args.jobs is None or args.jobs == jobs)
    ]
    results: dict[tuple[str, int, int | None, int], list[dict[str, Any]]] = {}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for r in range(args.rounds):
        bare = measure(trees["after"], {"bare": BARE_COMMITS})
        results.setdefault(("bare", BARE_COMMITS, None, 1), []).append(bare)
        print(f"round {r + 1} bare commits/s {bare['rate']:,.0f}", file=sys.stderr, flush=True)
        for jobs, keys, batch in cells:
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for side in order:
                cap = args.cap_before if side == "before" and args.cap_before else args.cap
                spec = {"jobs": jobs, "keys": keys, "batch": batch, "cap": cap, "stats": jobs == 100_000}
                if side == "after+sql":
                    spec["sql"] = args.sql
                result = measure(trees[side], spec)
                results.setdefault((side, jobs, keys, batch), []).append(result)
                star = "*" if result["capped"] else ""
                print(
                    f"round {r + 1} {side:6} {jobs:>7,} {label(keys, batch):18} {result['rate']:>9,.0f} jobs/s{star}"
                    f" {result['cpu_us']:8.0f} us CPU/job ({result['user_us']:.0f} user + {result['sys_us']:.0f} sys)",
                    file=sys.stderr,
                    flush=True,
                )
    caps = f"cap {args.cap:g} s" + (f", before {args.cap_before:g} s" if args.cap_before else "")
    print(f"{started}, {args.rounds} round(s), {caps}; {machine()}; load {os.getloadavg()[0]:.1f}")
    print("medians; jobs/s (* = stopped at the cap: rate over the jobs it ran), and CPU time per job\n")
    sides = " | ".join(trees)
    others = [side for side in trees if side != "before"] if "before" in trees else []
    over = " | ".join(f"{side}/before" for side in others) or "after/before"
    print(f"| jobs | case | {sides} | {over} | CPU/job: {sides} |")
    print("| ---: | --- | " + "---: | " * len(trees) + "---: | " * max(1, len(others)) + "---: | " * len(trees))
    for jobs, keys, batch in cells:
        medians = {}
        rates, cpus = [], []
        for side in trees:
            runs = results[(side, jobs, keys, batch)]
            medians[side] = statistics.median(x["rate"] for x in runs)
            capped = any(x["capped"] for x in runs)
            rates.append(f"{medians[side]:,.0f}{'*' if capped else ''}")
            split = "".join(f" {statistics.median(x[f'{k}_us'] for x in runs):,.0f} {k}" for k in ("user", "sys"))
            cpus.append(f"{statistics.median(x['cpu_us'] for x in runs):,.0f} us ({split.strip()})")
        ratio = " | ".join(f"{medians[side] / medians['before']:.2f}x" for side in others) or "-"
        print(f"| {jobs:,} | {label(keys, batch)} | {' | '.join(rates)} | {ratio} | {' | '.join(cpus)} |")
    print_round_ratios(results, others, cells)
    bare = statistics.median(x["rate"] for x in results[("bare", BARE_COMMITS, None, 1)])
    print(f"\nthe disk's serial limit: a bare sqlite3 loop of one-row UPDATE commits, {bare:,.0f} commits/s")
    for side in trees:
        stats = [x["stats_ms"] for x in results.get((side, 100_000, 1, 100), [])]
        if stats:
            print(f"observe.stats, 100,000 pending jobs on one target, {side}: {statistics.median(stats):.1f} ms")
    if all(("after", jobs, 1, 100) in results for jobs in (2_000, 20_000)):
        for what in ("rate", "cpu_us"):
            one = {n: statistics.median(x[what] for x in results[("after", n, 1, 100)]) for n in (2_000, 20_000)}
            print(f"after, K = 1, 20,000 jobs against 2,000: {what} {one[20_000] / one[2_000]:.2f}x")


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:  # a child failed: its last error line says why (a bad --sql, a broken tree)
        sys.exit(f"hot_target.py: {str(e).strip().splitlines()[-1]}")
