"""This tree's reconciler against another tree's, on the same ledger shape, the trees alternated.

    .venv/bin/python benchmarks/reconcile_before.py --before OTHER/src [--jobs 100000] [--rounds 6] [--postgres]

Each tree builds its own ledger with its own ``benchmarks/reconcile.py`` (``--jobs`` completed
create_file jobs, one file each, in sync; a tree reads only its own schema), its files on a tmpfs
when there is one. ``--postgres``: each tree's ledger is a fresh database on the local server
(``ADMIN_URL`` of ``pg_drain.py``), filled by that tree's own worker draining the jobs (100
directories). A round runs one fresh process per tree, the order alternating; each process
checks its ledger once in each mode to warm up, then twice more, and reports its best of the two:
existence (``content=False``), the default content check, and every file read (``full=True``;
a tree without that option reads every file in its default content check). The figures are
medians over the rounds of paths per second and of the per-round ratio to the other tree, with
a 90 % bootstrap interval of that ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from _common import median_interval

REPO = Path(__file__).resolve().parent.parent
MODES = ("exists", "content", "full")

_BUILD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from reconcile import build_ledger
build_ledger(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
"""

_BUILD_PG = """
import sys
from tether import Coordinator, CreateFile
jobs = int(sys.argv[3])
c = Coordinator.open(sys.argv[1], root=sys.argv[2])
for start in range(0, jobs, 1000):
    part = range(start, min(jobs, start + 1000))
    c.enqueue_many([CreateFile(path=f"d{i % 100:02d}/{i}.json", content={"i": i}) for i in part])
c.run_until_idle()
"""

_CHECK = """
import inspect, json, sys, time
from tether import Coordinator
from tether.reconcile.check import reconcile
c = Coordinator.open(sys.argv[1], root=sys.argv[2])
full = {"full": True} if "full" in inspect.signature(reconcile).parameters else {}
modes = {"exists": {"content": False}, "content": {}, "full": full}
best = {}
for run in range(3):
    for name, options in modes.items():
        started = time.perf_counter()
        reconcile(c, **options)
        if run:
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - started)
print(json.dumps(best))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, type=Path, help="the other tree's src")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--postgres", action="store_true", help="the ledgers on the local PostgreSQL server")
    args = ap.parse_args()
    trees = {"after": REPO / "src", "before": args.before.resolve()}
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="tether-reconcile-before-", dir=base))
    rates: dict[str, dict[str, list[float]]] = {side: {m: [] for m in MODES} for side in trees}
    try:
        with ExitStack() as databases:
            urls = {side: f"sqlite:///{work}/{side}.db" for side in trees}
            if args.postgres:
                from pg_drain import fresh_database

                urls = {side: databases.enter_context(fresh_database(f"rec_{side}")) for side in trees}
            for side, src in trees.items():
                if args.postgres:
                    build = [sys.executable, "-c", _BUILD_PG, urls[side], f"{work}/{side}", str(args.jobs)]
                else:
                    bench = src.parent / "benchmarks"
                    build = [
                        sys.executable,
                        "-c",
                        _BUILD,
                        str(bench),
                        f"{work}/{side}.db",
                        f"{work}/{side}",
                        str(args.jobs),
                    ]
                subprocess.run(build, env={**os.environ, "PYTHONPATH": str(src)}, check=True)
            load = os.getloadavg()[0]
            for n in range(args.rounds):
                for side in list(trees)[:: -1 if n % 2 else 1]:
                    check = [sys.executable, "-c", _CHECK, urls[side], f"{work}/{side}"]
                    env = {**os.environ, "PYTHONPATH": str(trees[side])}
                    done = subprocess.run(check, env=env, check=True, capture_output=True, text=True)
                    for mode, seconds in json.loads(done.stdout).items():
                        rates[side][mode].append(args.jobs / seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    where = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"{args.jobs:,} targets on {where}, {args.rounds} rounds, load average {load:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print(f"  {'check':10s} {'after':>12s} {'before':>12s} {'after/before':>13s}  (90 % interval; per-round range)")
    for mode in MODES:
        after, before = rates["after"][mode], rates["before"][mode]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        mid, low, high = median_interval(ratios)
        print(
            f"  {mode:10s} {statistics.median(after):>10,.0f}/s {statistics.median(before):>10,.0f}/s"
            f" {mid:>12.2f}x  ({low:.2f}-{high:.2f}; {min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
