"""What keeping a reconcile run's findings costs, and that the findings table stays bounded.

    .venv/bin/python benchmarks/drift_store.py [--jobs 1000000] [--drift 0.01] [--rounds 3] [--dir DIR]

A ledger of ``--jobs`` completed jobs, one target each, built with bulk inserts (the ledger of
benchmarks/reconcile.py: delete_file jobs of absent paths, which need no file on disk, and one
create_file); then ``--drift`` of the deleted paths are made again by hand, so each check finds
that many ``unexpected`` targets. A full check (existence; what these targets ask) runs with its
findings stored (as tether does) and with the store turned off (the baseline), alternating which
goes first in each round; the figures: the median of the per-round ratios stored / baseline, and
(steadier on a loaded machine) the same ratio of the process's CPU time, and the median of the
store's own time over the rest of its check.
Then ``TETHER_DRIFT_RUNS`` runs are kept of more checks: the table's rows are counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from _common import machine, scratch
from reconcile import build_ledger
from tether import Coordinator
from tether.ledger.schema import drift_findings
from tether.reconcile import findings
from tether.reconcile.check import reconcile


def drift_by_hand(root: Path, jobs: int, share: float) -> int:
    """Make again by hand every ``1/share``-th deleted path: each is an ``unexpected`` finding."""
    step = max(1, round(1 / share))
    made = 0
    for i in range(step, jobs, step):
        path = root / f"d{i % 1000:03d}" / f"{i:07d}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"{}")
        made += 1
    return made


STORING: list[float] = []  # seconds spent in findings.store, per stored check


def timed_store(*args: object, **kwargs: object) -> None:
    start = time.perf_counter()
    SAVED(*args, **kwargs)  # type: ignore[arg-type]
    STORING.append(time.perf_counter() - start)


SAVED = findings.store


CPU: dict[bool, list[float]] = {True: [], False: []}  # the process's CPU seconds per check


def timed_check(c: Coordinator, store: bool) -> tuple[float, int]:
    findings.store = timed_store if store else (lambda *args, **kwargs: None)  # type: ignore[assignment]
    try:
        start, cpu = time.perf_counter(), time.process_time()
        report = reconcile(c, content=False)
        CPU[store].append(time.process_time() - cpu)
        return time.perf_counter() - start, report.drift
    finally:
        findings.store = SAVED  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--drift", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", type=int, default=3, help="TETHER_DRIFT_RUNS for the bound check")
    parser.add_argument(
        "--dir", type=Path, default=Path("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    )
    args = parser.parse_args()
    print(machine(), flush=True)
    with scratch(args.dir, "tether-drift-store") as work:
        db, root = work / "ledger.db", work / "data"
        started = time.perf_counter()
        build_ledger(db, root, args.jobs, create_every=args.jobs + 1)
        made = drift_by_hand(root, args.jobs, args.drift)
        print(f"built {args.jobs:,} jobs, {made:,} paths drifted, in {time.perf_counter() - started:.1f}s", flush=True)
        c = Coordinator.open(f"sqlite:///{db}", root=root)
        try:
            timed_check(c, True)  # warm: the page cache, the ledger's pages
            samples: dict[bool, list[float]] = {True: [], False: []}
            for n in range(args.rounds):
                for store in (True, False) if n % 2 == 0 else (False, True):
                    seconds, drift = timed_check(c, store)
                    assert drift == made, (drift, made)
                    samples[store].append(seconds)
                    print(f"round {n}: {'stored  ' if store else 'baseline'} {seconds:.2f}s", flush=True)
            ratios = [s / b for s, b in zip(samples[True], samples[False], strict=True)]
            # The store's own share of each stored check (its time over the rest of that check):
            # within one check, so the machine's load moves both sides alike.
            shares = [t / (s - t) for t, s in zip(STORING[1 : 1 + args.rounds], samples[True], strict=True)]
            os.environ["TETHER_DRIFT_RUNS"] = str(args.keep)
            for _ in range(args.keep + 2):
                timed_check(c, True)
            with c.engine.connect() as conn:
                rows = conn.execute(sa.select(sa.func.count()).select_from(drift_findings)).scalar_one()
                runs = conn.execute(sa.select(sa.func.count(sa.distinct(drift_findings.c.run_id)))).scalar_one()
        finally:
            c.close()
    result = {
        "jobs": args.jobs,
        "drifted": made,
        "stored_s": statistics.median(samples[True]),
        "baseline_s": statistics.median(samples[False]),
        "stored_vs_baseline": statistics.median(ratios),
        "ratios": ratios,
        "cpu_stored_vs_baseline": statistics.median(
            [s / b for s, b in zip(CPU[True][1 : 1 + args.rounds], CPU[False], strict=True)]
        ),
        "store_s": statistics.median(STORING[1 : 1 + args.rounds]),
        "store_share_of_its_check": statistics.median(shares),
        "kept_runs": runs,
        "rows_after_keep_plus_2_runs": rows,
        "bound": args.keep * made,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
