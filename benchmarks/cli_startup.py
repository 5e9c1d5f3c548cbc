"""CLI start-up (issue 15, item 5): ``tether --help`` and ``tether status`` on a small ledger,
each the median of 10 cold runs (a new interpreter every run).

    .venv/bin/python benchmarks/cli_startup.py [--before SRC_DIR]

With ``--before``, the same runs also use the package in ``SRC_DIR`` (a checkout's ``src/``, put
first on ``PYTHONPATH``), interleaved with this checkout's, so the two are compared side by side;
``--before-python`` runs it with another interpreter (that checkout's venv, whose dependencies
may differ: issue 15 pinned typer below 0.28).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import REPO, SCRATCH, scratch

RUNS = 10
ENTRY = "import sys; from tether.cli import main; sys.argv[0] = 'tether'; main()"


def _run(python: str, src: Path, args: list[str], env: dict[str, str]) -> float:
    env = {**env, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    subprocess.run([python, "-c", ENTRY, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="src/ of the checkout to compare with")
    parser.add_argument("--before-python", default=sys.executable, help="the interpreter to run --before with")
    args = parser.parse_args()
    trees = {"after": REPO / "src"}
    python = {"after": sys.executable, "before": args.before_python}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    with scratch(SCRATCH, "cli-startup") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        env.update(TETHER_DB=f"sqlite:///{tmp}/tether.db", TETHER_ROOT=str(tmp / "data"))
        (tmp / "data").mkdir()
        payload = '{"path": "a.json", "content": {"a": 1}}'
        for argv in (["init"], ["enqueue", "create_file", "--payload", payload]):  # only init creates a ledger
            subprocess.run(
                [sys.executable, "-c", ENTRY, *argv],
                env={**env, "PYTHONPATH": str(trees["after"])},
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        commands = {"tether --help": ["--help"], "tether status": ["status"]}
        times: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in commands}
        for _ in range(RUNS):
            for command, argv in commands.items():
                for tree, src in trees.items():  # interleaved: both see the same load
                    times[(tree, command)].append(_run(python[tree], src, argv, env))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"median of {RUNS} cold runs (python {sys.version.split()[0]}, {os.cpu_count()} cores, load {load})")
    for command in commands:
        medians = {tree: statistics.median(times[(tree, command)]) for tree in trees}
        line = ", ".join(f"{tree} {m * 1000:.0f} ms" for tree, m in medians.items())
        if "before" in medians:
            rounds = [b / a for b, a in zip(times[("before", command)], times[("after", command)], strict=True)]
            line += f" ({medians['before'] / medians['after']:.2f}x faster; median ratio of the rounds "
            line += f"{statistics.median(rounds):.2f}x)"
        print(f"{command:15} {line}")


if __name__ == "__main__":
    main()
