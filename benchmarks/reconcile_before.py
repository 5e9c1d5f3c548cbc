"""This tree's reconciler against another tree's, on the same ledger shape, the trees alternated.

    .venv/bin/python benchmarks/reconcile_before.py --before OTHER/src [--jobs 100000] [--rounds 6]

Each tree builds its own ledger with its own ``benchmarks/reconcile.py`` (``--jobs`` completed
create_file jobs, one file each, in sync; a tree reads only its own schema), on a tmpfs when
there is one. A round runs one fresh process per tree, the order alternating; each process
checks its ledger once in each mode to warm up, then twice more, and reports its best of the two:
existence (``content=False``), the default content check, and every file read (``full=True``;
a tree without that option reads every file in its default content check). The figures are
medians over the rounds of paths per second and of the per-round ratio to the other tree.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODES = ("exists", "content", "full")

_BUILD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from reconcile import build_ledger
build_ledger(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
"""

_CHECK = """
import inspect, json, sys, time
from tether import Coordinator
from tether.reconcile.check import reconcile
c = Coordinator.open(f"sqlite:///{sys.argv[1]}", root=sys.argv[2])
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
    args = ap.parse_args()
    trees = {"after": REPO / "src", "before": args.before.resolve()}
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="tether-reconcile-before-", dir=base))
    rates: dict[str, dict[str, list[float]]] = {side: {m: [] for m in MODES} for side in trees}
    try:
        for side, src in trees.items():
            bench = src.parent / "benchmarks"
            build = [sys.executable, "-c", _BUILD, str(bench), f"{work}/{side}.db", f"{work}/{side}", str(args.jobs)]
            subprocess.run(build, env={**os.environ, "PYTHONPATH": str(src)}, check=True)
        load = os.getloadavg()[0]
        for n in range(args.rounds):
            for side in list(trees)[:: -1 if n % 2 else 1]:
                check = [sys.executable, "-c", _CHECK, f"{work}/{side}.db", f"{work}/{side}"]
                env = {**os.environ, "PYTHONPATH": str(trees[side])}
                done = subprocess.run(check, env=env, check=True, capture_output=True, text=True)
                for mode, seconds in json.loads(done.stdout).items():
                    rates[side][mode].append(args.jobs / seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.jobs:,} targets, {args.rounds} rounds, load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"  {'check':10s} {'after':>12s} {'before':>12s} {'after/before':>13s}  (per-round range)")
    for mode in MODES:
        after, before = rates["after"][mode], rates["before"][mode]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        print(
            f"  {mode:10s} {statistics.median(after):>10,.0f}/s {statistics.median(before):>10,.0f}/s"
            f" {statistics.median(ratios):>12.2f}x  ({min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
