"""``make bench`` (benchmarks/core.py) for two tether source trees in ABBA order: is one tree's
figure within a few per cent of the other's on a disk whose speed drifts from minute to minute?

    .venv/bin/python benchmarks/core_ab.py BEFORE_SRC [--blocks 8] [--runs 3] [--jobs 2000]

BEFORE_SRC is another checkout's ``src`` (``git worktree add --detach /tmp/before <commit>``);
this checkout's ``src`` is the other side. Each block runs ``core.py`` four times, each in a
fresh process: before, after, after, before. A fixed order (before, after, before, after...)
lets whatever the first process of a pair leaves behind (its deleted ledger's blocks written
back, the journal's commit) land on the second, always the same tree; ABBA gives each tree each
place equally. Prints, per figure of core.py's table: each tree's median over its processes (each
process's own figure is already its median of ``--runs``), their ratio with a 90 % bootstrap
interval over the processes, and the median of the blocks' ratios (each block's after pair over
its before pair) with its own bootstrap interval over the blocks.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

from _common import median_interval

REPO = Path(__file__).resolve().parent.parent
FIGURES = {
    "(a) enqueue latency p50": "enqueue p50, ms (lower is faster)",
    "(b) drain": "drain no-op, jobs/s",
    "(c) create_file": "create_file, jobs/s",
}
ORDER = ("before", "after", "after", "before")


def run_core(src: Path, runs: int, jobs: int) -> dict[str, float]:
    """One ``core.py`` process with ``src`` first on its path: its table's tether column."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, str(REPO / "benchmarks" / "core.py"), "--runs", str(runs), "--jobs", str(jobs)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"core.py failed on {src} (exit {done.returncode}): {last}")
    out = done.stdout
    figures = {}
    for line in out.splitlines():
        if line.startswith("tether: ") and not line.startswith(f"tether: {src}/tether"):
            raise SystemExit(f"core.py imported another tree than {src}: {line}")
        for label in FIGURES:
            if line.startswith(f"| {label}"):
                figures[label] = float(line.split("|")[2].replace(",", ""))
    if len(figures) != len(FIGURES):
        raise SystemExit(f"core.py printed no table:\n{out}")
    return figures


def interval(before: list[float], after: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 90 % bootstrap interval of median(after) / median(before), resampling each tree's processes."""
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(after, k=len(after))) / statistics.median(rng.choices(before, k=len(before)))
        for _ in range(draws)
    )
    return ratios[draws // 20], ratios[draws - draws // 20 - 1]


def _shown(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the other tree's src directory")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3, help="core.py's --runs in each process")
    parser.add_argument("--jobs", type=int, default=2000, help="core.py's --jobs")
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": REPO / "src"}
    if not (sides["before"] / "tether" / "__init__.py").is_file():
        raise SystemExit(f"{args.before} holds no tether package: give another checkout's src directory")
    got: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    blocks: list[list[tuple[str, dict[str, float]]]] = []
    for b in range(args.blocks):
        block = [(side, run_core(sides[side], args.runs, args.jobs)) for side in ORDER]
        for side, figures in block:
            got[side].append(figures)
        blocks.append(block)
        drain = [f"{side} {figures['(b) drain']:,.0f}" for side, figures in block]
        print(f"block {b + 1}/{args.blocks}: drain {', '.join(drain)}; load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\n{args.blocks} ABBA blocks, core.py --runs {args.runs} --jobs {args.jobs}; before = {sides['before']}")
    print("| figure | before | after | after / before (90 % interval) | median of blocks' ratios (90 % interval) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, name in FIGURES.items():
        before = [f[label] for f in got["before"]]
        after = [f[label] for f in got["after"]]
        low, high = interval(before, after)
        per_block = [
            statistics.fmean(f[label] for s, f in block if s == "after")
            / statistics.fmean(f[label] for s, f in block if s == "before")
            for block in blocks
        ]
        mb, ma = statistics.median(before), statistics.median(after)
        mid, block_low, block_high = median_interval(per_block)
        print(
            f"| {name} | {_shown(mb)} | {_shown(ma)} | {ma / mb:.3f} ({low:.3f}-{high:.3f}) | "
            f"{mid:.3f} ({block_low:.3f}-{block_high:.3f}) |"
        )


if __name__ == "__main__":
    main()
