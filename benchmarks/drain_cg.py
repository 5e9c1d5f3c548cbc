"""The SQLite one-worker drain in instructions a job (callgrind), for source trees side by side.

    .venv/bin/python benchmarks/drain_cg.py [SRC ...] [--small 300] [--big 1500] [--targets K] [--runs 1]

Each SRC is a checkout's ``src`` (default: this one's), put first on ``PYTHONPATH``. Per tree and
size, a child process drains no-op jobs enqueued beforehand (by another process, untimed) on a
ledger on tmpfs (``/dev/shm``: the fsync's wait is no instruction), with ``worker(threads=1,
batch=100, max_batch=100, slow_job=1e9, flush_after=1e9).run_until_idle()`` under ``valgrind
--tool=callgrind`` (``PYTHONHASHSEED=0``), after a warm-up drain of 200 jobs on another ledger in
the same process so that lazy imports and first-use caches are paid before. The paused types are
read once (``pausing.REFRESH``). Without ``--targets`` the jobs have no ordering key; with
``--targets K`` job i is on target ``k{i mod K}``, as benchmarks/hot_target.py's.

Prints, for the difference of the two sizes over the difference in jobs: the instructions a job of
the whole process and of the worker's threads (``start_thread``, inclusive), and the whole
process's split by object file (self cost: libsqlite3, the interpreter, libc, the rest).
``--sql`` runs SQL on each ledger between its fill and its drain, to price a trigger or an index
(the schema's layout is recorded, so the drain's open does not put it back).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WARM = 200


def child(action: str, url: str, jobs: int, targets: int | None, warm_url: str) -> None:
    """fill: enqueue ``jobs`` no-op jobs at ``url`` (and WARM at ``warm_url``); drain: both."""
    from hot_jobtypes import hot_noop
    from tether import Coordinator
    from tether.jobtypes import default_registry

    try:
        from tether.ledger import pausing

        pausing.REFRESH = 1e9
    except ImportError:  # a tree from before the paused types
        pass

    HotNoop, HotNoopType = hot_noop()

    registry = default_registry()
    registry.register(HotNoopType())
    root = Path(url.removeprefix("sqlite:///")).parent / "data"
    for where, n in ((warm_url, WARM), (url, jobs)):
        with Coordinator.open(where, root=root, registry=registry) as c:
            if action == "fill":
                c.enqueue_many([HotNoop(n=i, key=None if targets is None else f"k{i % targets}") for i in range(n)])
            else:
                worker = c.worker(threads=1, batch=100, max_batch=100, slow_job=1e9, flush_after=1e9)
                ran = worker.run_until_idle(install_signals=False)
                assert ran == n, f"ran {ran} of {n}"


def objects(out: Path) -> Counter[str]:
    """Self cost (Ir) by object file, read from a callgrind output file."""
    names: dict[str, str] = {}
    costs: Counter[str] = Counter()
    ob, after_call = "?", False
    with out.open(errors="replace") as f:
        for line in f:
            if line.startswith("ob="):
                m = re.match(r"ob=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m is None:
                    ob = line[3:].strip()
                else:
                    if m.group(2):
                        names[m.group(1)] = m.group(2)
                    ob = names[m.group(1)]
            elif line.startswith("calls="):
                after_call = True
                continue
            elif line[:1].isdigit() or line[:1] in "+-*":
                if not after_call:
                    costs[ob] += int(line.split()[1])
            elif line.startswith("cob="):  # names a callee's object: remember its compressed name
                m = re.match(r"cob=\((\d+)\) (.*)", line.rstrip("\n"))
                if m:
                    names[m.group(1)] = m.group(2)
            after_call = False
    return costs


def group(costs: Counter[str]) -> dict[str, int]:
    out = {"sqlite": 0, "python": 0, "libc": 0, "other": 0}
    for name, n in costs.items():
        base = os.path.basename(name)
        if "sqlite3" in base and "_sqlite3" not in base:
            out["sqlite"] += n
        elif base.startswith("libc.so") or base.startswith("libc-"):
            out["libc"] += n
        elif base.startswith("python") or base.startswith("libpython"):
            out["python"] += n
        else:
            out["other"] += n
    return out


def counted(
    src: Path, jobs: int, targets: int | None, scratch: Path, keep: Path | None = None, sql: str | None = None
) -> tuple[int, int, dict[str, int]]:
    """(whole process, worker threads, by object) instructions of one drain of ``jobs``; its
    callgrind output copied into ``keep``, if given, for callgrind_annotate; ``sql`` run on both
    ledgers between the fill and the drain."""
    d = Path(tempfile.mkdtemp(dir=scratch))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(PYTHONPATH=str(src), PYTHONHASHSEED="0")
    args = [f"sqlite:///{d}/ledger.db", str(jobs), str(targets or 0), f"sqlite:///{d}/warm.db"]
    try:
        me = [sys.executable, __file__, "--child"]
        subprocess.run([*me, "fill", *args], env=env, check=True, capture_output=True)
        for ledger in ("ledger.db", "warm.db") if sql else ():
            with sqlite3.connect(d / ledger) as conn:
                conn.executescript(sql)
        out = d / "callgrind.out"
        valgrind = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}"]
        subprocess.run([*valgrind, *me, "drain", *args], env=env, check=True, capture_output=True)
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        total = re.search(r"^([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", text, re.M)
        threads = re.search(r"^\s*([\d,]+) \([^)]*\)\s+\S*pthread_create\.c:start_thread ", text, re.M)
        assert total is not None and threads is not None, "callgrind_annotate's output changed"
        n = lambda m: int(m.group(1).replace(",", ""))  # noqa: E731
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(out, keep / f"callgrind.{src.parent.name}.{targets or 0}.{jobs}")
        return n(total), n(threads), group(objects(out))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="*", type=Path, help="checkouts' src directories (default: this one's)")
    parser.add_argument("--small", type=int, default=300)
    parser.add_argument("--big", type=int, default=1500)
    parser.add_argument("--targets", type=int, help="spread the jobs over this many targets (default: none)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--base", default="/dev/shm", help="where the ledgers go")
    parser.add_argument("--sql", help="SQL run on each ledger before its drain (an experiment: a trigger dropped)")
    parser.add_argument("--keep", type=Path, help="keep the callgrind outputs in this directory")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        action, url, jobs, targets, warm = args.child
        child(action, url, int(jobs), int(targets) or None, warm)
        return
    trees = [src.resolve() for src in args.trees] or [(REPO / "src").resolve()]
    span = args.big - args.small
    case = "no target" if args.targets is None else f"{args.targets} target(s)"
    columns = "whole | worker threads | sqlite python libc other"
    print(f"instructions a job ({args.big} - {args.small} jobs, {case}): {columns}")
    with tempfile.TemporaryDirectory(dir=args.base) as scratch:
        for src in trees:
            for _ in range(args.runs):
                total0, threads0, ob0 = counted(src, args.small, args.targets, Path(scratch), args.keep, args.sql)
                total1, threads1, ob1 = counted(src, args.big, args.targets, Path(scratch), args.keep, args.sql)
                split = " ".join(f"{(ob1[k] - ob0[k]) / span:,.0f}" for k in ob0)
                print(
                    f"{src}: {(total1 - total0) / span:,.0f} | {(threads1 - threads0) / span:,.0f} | {split}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
