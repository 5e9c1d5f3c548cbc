"""Issue 19, row 4 on SQLite: 1, 2 and 4 ``tether worker`` processes draining one ledger together.

    .venv/bin/python benchmarks/procs.py [--jobs 20000] [--workers 1,2,4] [--rounds 5] [--before SRC]

Per round and worker count: a fresh SQLite ledger under ``.bench/`` (WAL + synchronous=FULL, the
defaults); N ``tether --import benchmarks.procs_ready worker --quiet`` processes are started and
waited for (each writes a ready file once its ledger is open, so imports and start-up are never
timed, nor compete with the drain for the 2 cores); then ``--jobs`` no-op jobs (``pg_noop`` from
tests/pg_jobtypes.py) are enqueued in one transaction, and the processes (woken by the WAL
watcher) drain them. Once all completed they are stopped with SIGTERM.

The rate is jobs / drain window, the window read from the ledger: min(claimed_at) to
max(completed_at) (as benchmarks/pg_drain.py). The order of the worker counts rotates per round;
each figure is the median over rounds, each ratio ("vs 1") the median of the per-round ratios
to the one-worker drain of the same round. With ``--before SRC`` (another checkout's ``src/``,
first on the workers' PYTHONPATH) both trees are measured in every round, sides alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from _common import REPO, SCRATCH, machine, scratch

TETHER = Path(sys.executable).with_name("tether")


def start_workers(
    db: Path, root: Path, workers: int, src: Path | None, ready: Path, profile: Path | None
) -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = os.pathsep.join([*([str(src)] if src else []), str(REPO)])
    env["TETHER_BENCH_READY"] = str(ready)
    if profile is not None:
        env["TETHER_BENCH_PROFILE"] = str(profile)
    command = [
        str(TETHER),
        "--db",
        f"sqlite:///{db}",
        "--root",
        str(root),
        "--import",
        "benchmarks.procs_ready",
        "worker",
        "--quiet",
    ]
    return [
        subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(workers)
    ]


def wait_ready(procs: list[subprocess.Popen], ready: Path, src: Path, timeout: float = 120) -> None:
    """Until every process wrote its ready file, each naming the tether in ``src``."""
    deadline = time.monotonic() + timeout
    while len(list(ready.glob("[!.]*"))) < len(procs):
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"worker exited {dead[0].returncode}: {dead[0].stderr.read().decode()[-1500:]}")
        if time.monotonic() > deadline:
            raise RuntimeError("workers not ready in time")
        time.sleep(0.02)
    for f in ready.glob("[!.]*"):
        if Path(f.read_text()).resolve() != (src / "tether").resolve():
            raise RuntimeError(f"a worker ran the tether in {f.read_text()}, not the one in {src}")
    # From the ready file to the worker's first (empty) claim is a few statements; let them pass.
    time.sleep(0.3)


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        _, err = p.communicate(timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"worker exited {p.returncode}: {err.decode()[-1500:]}")


# Run by the measured tree (``src`` first on the path), so the ledger is made and filled by the
# code its workers run: an older tree refuses a ledger a newer one made.
_LEDGER = """
import sys
from pathlib import Path
from tests import pg_jobtypes
from tether import Coordinator
from tether.jobtypes import default_registry
db, root, jobs = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
registry = default_registry()
pg_jobtypes.register(registry)
with Coordinator.open(f"sqlite:///{db}", root=root, registry=registry) as c:
    if jobs:
        c.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(jobs)])
"""


def _ledger(src: Path, db: Path, root: Path, jobs: int) -> None:
    """Make the ledger (``jobs`` 0) or enqueue ``jobs`` no-op jobs in one transaction, by ``src``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO)])}
    subprocess.run([sys.executable, "-c", _LEDGER, str(db), str(root), str(jobs)], env=env, cwd=REPO, check=True)


def drain(jobs: int, workers: int, src: Path, profile: bool = False) -> tuple[float, int, str]:
    """Jobs/s of ``workers`` processes (running the tether in ``src``) draining ``jobs``
    no-op jobs, and how many claims took them (distinct claimed_at: a claim stamps its batch)."""
    with scratch(SCRATCH, "procs") as d:
        db, root, ready = d / "ledger.db", d / "root", Path(tempfile.mkdtemp(dir=d))
        spent = Path(tempfile.mkdtemp(dir=d)) if profile else None
        root.mkdir()
        _ledger(src, db, root, 0)
        procs = start_workers(db, root, workers, src, ready, spent)
        try:
            wait_ready(procs, ready, src)
            _ledger(src, db, root, jobs)
            deadline = time.monotonic() + 1800
            conn = sqlite3.connect(db, timeout=30)
            try:
                while conn.execute("SELECT count(*) FROM tether_jobs WHERE status = 'completed'").fetchone()[0] < jobs:
                    if time.monotonic() > deadline:
                        raise RuntimeError("not drained in time")
                    time.sleep(0.05)
                first, last = conn.execute("SELECT min(claimed_at), max(completed_at) FROM tether_jobs").fetchone()
                claims = conn.execute("SELECT count(DISTINCT claimed_at) FROM tether_jobs").fetchone()[0]
            finally:
                conn.close()
        finally:
            stop(procs)
        report = "" if spent is None else _spent(spent)
    seconds = (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
    return jobs / seconds, claims, report


def _spent(directory: Path) -> str:
    """Per process (``--profile``): seconds waiting for the write lock / inside write transactions
    (the wait included) / in their COMMITs / in handlers, and write transactions."""
    parts = []
    for f in sorted(directory.iterdir()):
        s = json.loads(f.read_text())
        parts.append(
            f"wait {s['lock_wait']:.2f} write {s['in_write']:.2f} commit {s['commit']:.2f} "
            f"run {s['handlers']:.2f} ({s['writes']} tx)"
        )
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--workers", default="1,2,4", help="worker process counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="another checkout's src/ to measure beside this one")
    parser.add_argument("--profile", action="store_true", help="per process: time waiting for the write lock, etc.")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    trees = {"after": REPO / "src"} if args.before is None else {"before": args.before, "after": REPO / "src"}
    print(f"{machine()}; load {os.getloadavg()[0]:.1f}; {args.jobs} no-op jobs; {args.rounds} rounds", flush=True)

    rates: dict[tuple[str, int], list[float]] = {}
    t0 = time.monotonic()
    for r in range(args.rounds):
        order = counts[r % len(counts) :] + counts[: r % len(counts)]
        sides = list(trees) if r % 2 == 0 else list(reversed(trees))
        for workers in order:
            for side in sides:
                rate, claims, spent = drain(args.jobs, workers, trees[side], args.profile)
                rates.setdefault((side, workers), []).append(rate)
                print(
                    f"  round {r + 1} {side:6} {workers} worker(s): {rate:7.0f} jobs/s  "
                    f"({claims} claims, {args.jobs / claims:.0f} jobs each; load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                if spent:
                    print(f"    seconds per process: {spent}", flush=True)

    print(f"\nmedians over {args.rounds} rounds ({time.monotonic() - t0:.0f}s in all; load {os.getloadavg()[0]:.1f})")
    header = f"{'workers':>7}" + "".join(f" {side + ' jobs/s':>14} {'vs 1':>6}" for side in trees)
    if len(trees) == 2:
        header += f" {'after/before':>13}"
    print(header)
    for workers in counts:
        line = f"{workers:>7}"
        for side in trees:
            vs1 = [a / b for a, b in zip(rates[(side, workers)], rates[(side, counts[0])], strict=True)]
            line += f" {statistics.median(rates[(side, workers)]):>14,.0f} {statistics.median(vs1):>6.2f}"
        if len(trees) == 2:
            ab = [a / b for a, b in zip(rates[("after", workers)], rates[("before", workers)], strict=True)]
            line += f" {statistics.median(ab):>13.2f}"
        print(line)


if __name__ == "__main__":
    main()
