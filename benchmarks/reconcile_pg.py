"""The reconciler on PostgreSQL: each tree's check of its own ledger, the trees alternated.

    .venv/bin/python benchmarks/reconcile_pg.py [--jobs 30000] [--rounds 5] [--repeat 5] [--before SRC] [--after SRC]

Per tree: a fresh database on the local server (``ADMIN_URL`` of ``pg_drain.py``) and a data
root on a tmpfs where there is one, filled by that tree's own worker draining ``--jobs``
create_file jobs (one small file each, 100 directories). A round runs one fresh process per
tree, the order alternating; each process checks its ledger once in each mode to warm up, then
``--repeat`` times, and reports the median: existence (``content=False``), the default content
check, and every file read (``full=True``, where the tree has it). The figures are medians over
the rounds, with the median of the per-round ratios to before.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from _common import machine, median_interval, run_child, scratch, tree_options, trees_or_child
from pg_drain import fresh_database

MODES = ("exists", "content", "full")


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import inspect

    import tether
    from tether import Coordinator, CreateFile
    from tether.reconcile.check import reconcile

    c = Coordinator.open(spec["url"], root=spec["root"])
    out: dict[str, Any] = {"src": os.path.dirname(tether.__file__)}
    if spec["action"] == "build":
        jobs = spec["jobs"]
        for start in range(0, jobs, 1000):
            c.enqueue_many(
                [
                    CreateFile(path=f"d{i % 100:02d}/{i}.json", content={"i": i})
                    for i in range(start, min(jobs, start + 1000))
                ]
            )
        c.run_until_idle()
        return out
    full = {"full": True} if "full" in inspect.signature(reconcile).parameters else {}
    modes: dict[str, dict[str, Any]] = {"exists": {"content": False}, "content": {}, "full": full}
    for name, options in modes.items():
        reconcile(c, **options)
        times = []
        for _ in range(spec["repeat"]):
            started = time.perf_counter()
            report = reconcile(c, **options)
            times.append(time.perf_counter() - started)
        if report.counts.get("in_sync") != spec["jobs"]:
            raise RuntimeError(f"{name}: {report.counts} (expected {spec['jobs']} in sync)")
        out[name] = statistics.median(times) * 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    tree_options(ap)
    args = ap.parse_args()
    trees = trees_or_child(args, child)
    if trees is None:
        return
    script = str(Path(__file__).resolve())
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(__file__).resolve().parent.parent / ".bench"
    print(f"{args.jobs:,} targets on PostgreSQL, {args.rounds} rounds; {machine()}", flush=True)
    with scratch(base, "reconcile-pg") as work:
        ledgers: dict[str, tuple[str, str]] = {}
        with fresh_database("rec_before") as before_url, fresh_database("rec_after") as after_url:
            urls = {"before": before_url, "after": after_url}
            for side, src in trees.items():
                root = str(work / side)
                ledgers[side] = (urls[side], root)
                spec = {"action": "build", "url": urls[side], "root": root, "jobs": args.jobs}
                run_child(script, src, spec)
            samples: dict[str, dict[str, list[float]]] = {side: {m: [] for m in MODES} for side in trees}
            for n in range(args.rounds):
                order = list(trees) if n % 2 == 0 else list(reversed(trees))
                for side in order:
                    url, root = ledgers[side]
                    spec = {"action": "check", "url": url, "root": root, "jobs": args.jobs, "repeat": args.repeat}
                    got = run_child(script, trees[side], spec)
                    for m in MODES:
                        samples[side][m].append(got[m])
                    print(f"round {n + 1} {side:6s} " + ", ".join(f"{m} {got[m]:.0f} ms" for m in MODES), flush=True)
    print("\nmedians of the rounds, ms a check (lower is faster)")
    print(
        "  check     "
        + "".join(f"{side:>10s}" for side in trees)
        + ("  after/before (90 % interval)" if len(trees) == 2 else "")
    )
    for m in MODES:
        line = f"  {m:8s}  " + "".join(f"{statistics.median(samples[side][m]):10.0f}" for side in trees)
        if len(trees) == 2:
            ratios = [a / b for a, b in zip(samples["after"][m], samples["before"][m], strict=True)]
            mid, low, high = median_interval(ratios)
            line += f"  {mid:.3f} ({low:.3f}-{high:.3f}) of the time"
        print(line)


if __name__ == "__main__":
    main()
