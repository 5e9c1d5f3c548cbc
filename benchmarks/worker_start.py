"""A worker's fixed cost: ``run_until_idle`` with nothing to run, and the unserved check, per tree.

    .venv/bin/python benchmarks/worker_start.py [--before SRC] [--runs 15] [--rounds 3]
        [--pending 200000] [--dir DIR] [--no-fsyncs]

Each measurement runs in a fresh interpreter (``--child``) with one tree's ``src/`` first on
PYTHONPATH, on a ledger made by that tree under ``--dir`` (default ``.bench/``, the repo's disk:
fsyncs cost what they cost there; ``/dev/shm`` leaves only the CPU), SQLite WAL +
synchronous=FULL. Sides alternate in ``--rounds`` rounds (the side going first alternates too);
each figure is the median over every run of every round.

  empty      ``c.worker(threads=1).run_until_idle()`` on an empty ledger, a new worker each run
             (as a script started by cron makes one), ``--runs`` runs after one untimed.
  backlog    the same on a ledger holding ``--pending`` pending jobs of a type the worker has
             (create_file), which it is not asked to run: one job on one target is held by
             another worker (claimed, its lock fresh) and every other job waits blocked behind
             it, so no claim reads them. The stale-lock sweep that ``run_until_idle`` starts with
             still reads every active job with a target once (LOST_HEADS, on both trees).
  check      the unserved check alone on that ledger, ``worker.unserved()`` (a tree without it
             prints n/a): what a worker pays at its start and each time it runs out of work.

Fsyncs: each tree's ``empty`` child runs once more under ``strace -f -e fsync,fdatasync``, its
timed runs between two marker calls (``access`` of a path nobody has); the fsyncs and fdatasyncs
between the markers, divided by the runs, are the fsyncs per run (``--no-fsyncs`` skips this;
without strace it prints n/a).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _common
from _common import SCRATCH, machine, scratch

MARK_START = "/nonexistent/tether-worker-start-bench/start"
MARK_END = "/nonexistent/tether-worker-start-bench/end"


# -- the child: one tree, one ledger ----------------------------------------------------------------


def _open(directory: Path) -> Any:
    from tether import Coordinator

    return Coordinator.open(f"sqlite:///{directory}/ledger.db", root=directory / "data", durability="full")


def _timed_runs(c: Any, runs: int) -> list[float]:
    c.worker(threads=1).run_until_idle(install_signals=False)  # untimed: modules loaded, pool warm
    times = []
    os.access(MARK_START, os.F_OK)
    for _ in range(runs):
        worker = c.worker(threads=1)
        t0 = time.perf_counter()
        worker.run_until_idle(install_signals=False)
        times.append(time.perf_counter() - t0)
    os.access(MARK_END, os.F_OK)
    return times


def _fill_backlog(c: Any, directory: Path, pending: int) -> None:
    """One create_file job on one target, held by another worker; ``pending`` jobs on that target
    blocked behind it, inserted straight into the table (building each through tether would take
    longer than the measurement)."""
    from tether import CreateFile

    head = c.enqueue(CreateFile(path="hot.json", content=0)).job
    [held] = c.queue.claim("holder:1:aaaaaa")
    assert held.id == head.id
    conn = sqlite3.connect(directory / "ledger.db", isolation_level=None)
    try:
        [(created_at, run_at, key, payload)] = conn.execute(
            "SELECT created_at, run_at, ordering_key, payload FROM tether_jobs WHERE id = ?", (head.id,)
        ).fetchall()
        rows = [(f"{head.id}{i:07d}", payload, created_at, run_at, key, len(payload)) for i in range(pending)]
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO tether_jobs (id, type, payload, status, priority, attempts, max_attempts, created_at,"
            " run_at, ordering_key, blocked, payload_bytes)"
            " VALUES (?, 'create_file', ?, 'pending', 0, 0, 3, ?, ?, ?, 1, ?)",
            rows,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import tether

    directory = Path(spec["dir"])
    out: dict[str, Any] = {"src": str(Path(tether.__file__).parent)}
    with _open(directory) as c:
        if spec["figure"] == "backlog":
            _fill_backlog(c, directory, spec["pending"])
            worker = c.worker(threads=1)
            if hasattr(worker, "unserved"):
                assert worker.unserved() == {}
                checks = []
                for _ in range(spec["runs"]):
                    t0 = time.perf_counter()
                    worker.unserved()
                    checks.append(time.perf_counter() - t0)
                out["check"] = checks
        out["times"] = _timed_runs(c, spec["runs"])
    return out


# -- the parent --------------------------------------------------------------------------------------


def run_child(src: Path, spec: dict[str, Any], *, strace: Path | None = None) -> dict[str, Any]:
    trace = () if strace is None else ("strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,access", "-o", str(strace))
    return _common.run_child(__file__, src, spec, prefix=trace)


def fsyncs_per_run(src: Path, base: Path, runs: int) -> float | None:
    """Fsyncs and fdatasyncs per ``run_until_idle`` on an empty ledger, counted by strace."""
    if shutil.which("strace") is None:
        return None
    with scratch(base, "worker-start-strace") as d:
        trace = d / "strace.txt"
        run_child(src, {"figure": "empty", "dir": str(d), "runs": runs}, strace=trace)
        inside, count = False, 0
        for line in trace.read_text().splitlines():
            if MARK_START in line:
                inside = True
            elif MARK_END in line:
                inside = False
            elif inside and ("fsync(" in line or "fdatasync(" in line):
                count += 1
    return count / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.tree_options(parser)
    parser.add_argument("--runs", type=int, default=15, help="timed runs per child (default 15)")
    parser.add_argument("--rounds", type=int, default=3, help="children per tree and figure (default 3)")
    parser.add_argument("--pending", type=int, default=200_000, help="the backlog's blocked jobs (default 200000)")
    parser.add_argument("--dir", type=Path, default=SCRATCH, help="where the ledgers go (default .bench/)")
    parser.add_argument("--no-fsyncs", action="store_true", help="skip the strace count")
    args = parser.parse_args()
    trees = _common.trees_or_child(args, child)
    if trees is None:
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()
    got: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for figure in ("empty", "backlog"):
            for side in order:
                with scratch(args.dir, f"worker-start-{figure}") as d:
                    spec = {"figure": figure, "dir": str(d), "runs": args.runs, "pending": args.pending}
                    out = run_child(trees[side], spec)
                got.setdefault((figure, side), []).extend(out["times"])
                if "check" in out:
                    got.setdefault(("check", side), []).extend(out["check"])
        print(f"round {r + 1} done", file=sys.stderr, flush=True)
    fsyncs = {side: None if args.no_fsyncs else fsyncs_per_run(src, args.dir, args.runs) for side, src in trees.items()}
    print(
        f"{started}; {args.rounds} rounds x {args.runs} runs; ledgers under {args.dir}; {machine()}; load average "
        f"{load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
        + ", ".join(f"{k} = {v}" for k, v in trees.items())
    )
    print("medians in ms (min-max over runs)\n")
    print("| figure | " + " | ".join(trees) + " |")
    print("| --- | " + " | ".join("---:" for _ in trees) + " |")
    names = {
        "empty": "run_until_idle, empty ledger",
        "backlog": f"run_until_idle, {args.pending:,} blocked pending jobs of a served type",
        "check": f"unserved check alone, {args.pending:,} blocked pending jobs",
    }
    for figure, name in names.items():
        cells = []
        for side in trees:
            v = got.get((figure, side))
            cells.append(
                "n/a" if not v else f"{statistics.median(v) * 1e3:.3f} ({min(v) * 1e3:.3f}-{max(v) * 1e3:.3f})"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = ["n/a" if f is None else f"{f:.2f}" for f in fsyncs.values()]
    print("| fsyncs per run_until_idle, empty ledger | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
