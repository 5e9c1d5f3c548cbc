"""The small-job drain of two tether source trees, alternated: did a change slow the hot path?

    .venv/bin/python benchmarks/drain_ab.py BASE_SRC [--jobs 20000] [--rounds 8] [--claims] [--singles 0]

BASE_SRC is another checkout's ``src`` (e.g. ``git worktree add /tmp/base main``, or
``git archive main src | tar -x -C /tmp/base``); this checkout's ``src`` is the other side. Each
round drains ``--jobs`` no-op jobs (enqueued untimed with ``enqueue_many``) with one worker
thread at full durability, once per side in a fresh process and ledger, the side that goes first
alternating from round to round. Prints each side's median jobs/s (wall and per CPU-second of
the process) and the median of the per-round ratios (this checkout / base).

With ``--claims`` each round times the claim path alone instead: ``--jobs`` claims of one job
each (``queue.claim``, its own transaction, as a worker's claim while jobs are slow), nothing
recorded, so every claim walks past the ones before it in the claimed set. With ``--singles N``
the same process first enqueues N jobs one ``enqueue`` at a time (each its own durable commit) on
a ledger of their own, and the single enqueue is compared the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import NOOP_TYPE

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / ".bench"

# Run in a fresh interpreter with the side's src first on sys.path.
_CHILD = (
    """
import json, sys, time"""
    + NOOP_TYPE
    + """
directory, jobs, claims, singles = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "claims", int(sys.argv[4])
single = {}
if singles:
    s = Coordinator.open(f"sqlite:///{directory}/singles.db", root=f"{directory}/data")
    s.register(NoopType())
    s.enqueue(Noop(n=-1))  # the first commit creates the file: not timed
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(singles):
        s.enqueue(Noop(n=i))
    single = {"single_wall": time.perf_counter() - wall, "single_cpu": time.process_time() - cpu}
    s.close()
c = Coordinator.open(f"sqlite:///{directory}/ledger.db", root=f"{directory}/data")
c.register(NoopType())
c.enqueue_many([Noop(n=i) for i in range(jobs)])
w = c.worker(threads=1)
wall, cpu = time.perf_counter(), time.process_time()
if claims:
    ran = sum(len(c.queue.claim("w")) for _ in range(jobs))
else:
    ran = w.run_until_idle(install_signals=False)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
assert ran == jobs, ran
import tether
print(json.dumps({"wall": wall, "cpu": cpu, "tether": tether.__file__, **single}))
"""
)


def drain(src: Path, jobs: int, claims: bool = False, singles: int = 0) -> dict[str, float]:
    SCRATCH.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=SCRATCH, prefix="drain-ab-") as d:
        env = {**os.environ, "PYTHONPATH": str(src)}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, d, str(jobs), "claims" if claims else "drain", str(singles)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path, help="the other tree's src directory")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--claims", action="store_true", help="time single claims instead of a drain")
    ap.add_argument("--singles", type=int, default=0, help="also time this many single enqueues per side")
    args = ap.parse_args(argv)
    sides = {"base": args.base.resolve(), "this": REPO / "src"}
    wall: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    single_wall: dict[str, list[float]] = {s: [] for s in sides}
    single_cpu: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            got = drain(sides[side], args.jobs, args.claims, args.singles)
            assert str(sides[side]) in str(got["tether"]), got  # the side's own tree ran
            wall[side].append(args.jobs / got["wall"])
            cpu[side].append(args.jobs / got["cpu"])
            if args.singles:
                single_wall[side].append(got["single_wall"] / args.singles * 1e6)
                single_cpu[side].append(got["single_cpu"] / args.singles * 1e6)
        print(
            f"round {r + 1}: base {wall['base'][-1]:,.0f} jobs/s, this {wall['this'][-1]:,.0f} jobs/s "
            f"({wall['this'][-1] / wall['base'][-1]:.3f}x)",
            flush=True,
        )
    for side in sides:
        print(
            f"{side}: median {statistics.median(wall[side]):,.0f} jobs/s wall, "
            f"{statistics.median(cpu[side]):,.0f} per CPU-s"
        )
    ratios = [t / b for t, b in zip(wall["this"], wall["base"], strict=True)]
    cpu_ratios = [t / b for t, b in zip(cpu["this"], cpu["base"], strict=True)]
    print(
        f"this / base: median of per-round ratios {statistics.median(ratios):.3f}x wall "
        f"(range {min(ratios):.3f}-{max(ratios):.3f}), {statistics.median(cpu_ratios):.3f}x per CPU-s "
        f"(range {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f})"
    )
    if args.singles:
        for side in sides:
            print(
                f"{side}: single enqueue median {statistics.median(single_wall[side]):,.0f} us wall, "
                f"{statistics.median(single_cpu[side]):,.1f} us CPU"
            )
        ratios = [t / b for t, b in zip(single_wall["this"], single_wall["base"], strict=True)]
        cpu_ratios = [t / b for t, b in zip(single_cpu["this"], single_cpu["base"], strict=True)]
        print(
            f"single enqueue, this / base (time per enqueue: lower is faster): median of per-round ratios "
            f"{statistics.median(ratios):.3f}x wall (range {min(ratios):.3f}-{max(ratios):.3f}), "
            f"{statistics.median(cpu_ratios):.3f}x CPU (range {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
