"""The PostgreSQL one-worker drain in instructions a job (callgrind), for source trees side by side.

    .venv/bin/python benchmarks/pg_worker_cg.py [OTHER_SRC ...] [--small 300] [--big 1500] [--runs 1]
    .venv/bin/python benchmarks/pg_worker_cg.py [OTHER_SRC ...] --cpu [--big 5000] [--runs 3]

This checkout's ``src`` is the first tree, each OTHER_SRC (another checkout's ``src``, e.g.
``git archive 7b8cce9 src tests | tar -x -C /tmp/before``; its ``tests`` beside it gives
``pg_jobtypes``) one more. Per tree and size, a child process drains ``pg_noop`` jobs enqueued
beforehand, in a database of their own, with ``worker(threads=1, batch=100, slow_job=1e9,
flush_after=1e9).run_until_idle()`` under ``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``),
after a warm-up drain of 200 jobs in the same process so that lazy imports and first-use caches
are paid before. The paused types are read once (``pausing.REFRESH``): every 0.5 s is every few
batches under valgrind's slowdown. Prints, for the difference of the two sizes, the instructions a
job of the worker's threads (``start_thread``, inclusive) and of the whole process; the rest is
the supervising thread, whose work goes by the clock and so is noise under valgrind.

With ``--cpu``, no valgrind: each run drains ``--big`` jobs with the CLI worker's defaults
(``worker(threads=1)``), the trees interleaved, and prints the CPU time of the client process and
of the ledger database's client backends (``/proc/PID/schedstat``; the server on this machine).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import sqlalchemy as sa

from _common import PG_CHILD_PRELUDE

REPO = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get("TETHER_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

# Run with a tree's src and tests first on sys.path: fill URL N | drain URL WARM_URL.
_CHILD = (
    PG_CHILD_PRELUDE
    + """
root = sys.argv[4]
if sys.argv[1] == "fill":
    with Coordinator.open(sys.argv[2], root=root, registry=registry) as c:
        c.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(int(sys.argv[3]))])
elif sys.argv[1] == "drain":
    for url in (sys.argv[3], sys.argv[2]):  # the warm-up, then the measured drain
        with Coordinator.open(url, root=root, registry=registry) as c:
            c.worker(threads=1, batch=100, slow_job=1e9, flush_after=1e9).run_until_idle(install_signals=False)
else:  # cpu: the same, natively, with the worker's defaults; the CPU of both sides
    import os, time
    def ran(pid):
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    with Coordinator.open(sys.argv[3], root=root, registry=registry) as c:
        c.worker(threads=1).run_until_idle(install_signals=False)
    with Coordinator.open(sys.argv[2], root=root, registry=registry) as c:
        with c.engine.connect() as conn:
            backends = [r[0] for r in conn.exec_driver_sql(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend'")]
        start, cpu = [ran(p) for p in backends], time.process_time()
        c.worker(threads=1).run_until_idle(install_signals=False)
        cpu, server = time.process_time() - cpu, sum(ran(p) for p in backends) - sum(start)
    print(f"client {cpu * 1e3:.1f} ms, server {server / 1e6:.1f} ms", file=sys.stderr)
"""
)


def database(admin: sa.Engine, jobs: int, src: Path, root: str) -> str:
    name = "cg_" + secrets.token_hex(4)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    url = ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    child(src, ["fill", url, str(jobs), root])
    return url


def child(src: Path, args: list[str], prefix: list[str] | None = None) -> str:
    """Run _CHILD with ``src``'s tree first on the path; returns what it printed on stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(src.parent / "tests")]), "PYTHONHASHSEED": "0"}
    cmd = [*(prefix or []), sys.executable, "-c", _CHILD, *args]
    return subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr


def cpu(src: Path, jobs: int, admin: sa.Engine, scratch: str) -> str:
    """The client's and the server's CPU time of one native drain of ``jobs``."""
    url, warm = database(admin, jobs, src, scratch), database(admin, 300, src, scratch)
    try:
        return child(src, ["cpu", url, warm, scratch]).strip().splitlines()[-1]
    finally:
        drop(admin, url, warm)


def drop(admin: sa.Engine, *urls: str) -> None:
    with admin.connect() as conn:
        for url in urls:
            conn.exec_driver_sql(f"DROP DATABASE {url.rsplit('/', 1)[1]} WITH (FORCE)")


def instructions(src: Path, jobs: int, admin: sa.Engine, scratch: str) -> tuple[int, int]:
    """(whole process, worker threads) instructions of one drain of ``jobs`` after its warm-up."""
    url, warm = database(admin, jobs, src, scratch), database(admin, 200, src, scratch)
    out = os.path.join(scratch, f"callgrind.{secrets.token_hex(4)}")
    try:
        prefix = ["valgrind", "--tool=callgrind", "--dump-instr=no", f"--callgrind-out-file={out}"]
        child(src, ["drain", url, warm, scratch], prefix)
    finally:
        drop(admin, url, warm)
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", out], capture_output=True, text=True, check=True
    ).stdout
    total = re.search(r"^([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", text, re.M)
    threads = re.search(r"^\s*([\d,]+) \([^)]*\)\s+\S*pthread_create\.c:start_thread ", text, re.M)
    assert total is not None and threads is not None, "callgrind_annotate's output changed"
    return int(total.group(1).replace(",", "")), int(threads.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("others", nargs="*", type=Path, help="other checkouts' src directories")
    parser.add_argument("--small", type=int, default=300)
    parser.add_argument("--big", type=int, default=1500)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--cpu", action="store_true", help="CPU time of native drains of --big jobs instead")
    args = parser.parse_args()
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    trees = [(REPO / "src").resolve(), *(src.resolve() for src in args.others)]
    if args.cpu:
        with tempfile.TemporaryDirectory() as scratch:
            for run in range(args.runs):
                for src in trees:
                    print(f"run {run + 1} {src}: {cpu(src, args.big, admin, scratch)}", flush=True)
        admin.dispose()
        return
    span = args.big - args.small
    print(f"instructions a job ({args.big} - {args.small} jobs): worker threads | whole process")
    with tempfile.TemporaryDirectory() as scratch:
        for src in trees:
            for _ in range(args.runs):
                total0, threads0 = instructions(src, args.small, admin, scratch)
                total1, threads1 = instructions(src, args.big, admin, scratch)
                print(f"{src}: {(threads1 - threads0) / span:,.0f} | {(total1 - total0) / span:,.0f}", flush=True)
    admin.dispose()


if __name__ == "__main__":
    main()
