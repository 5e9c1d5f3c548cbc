"""Round trips of the PostgreSQL one-worker drain, for source trees side by side (strace).

    .venv/bin/python benchmarks/pg_round_trips.py [OTHER_SRC ...] [--small 300] [--big 1500] [--jobs create_file]

This checkout's ``src`` is the first tree, each OTHER_SRC (another checkout's ``src``, its
``tests`` beside it for ``pg_jobtypes``) one more. Per tree and size, a child process drains
``pg_noop`` jobs (``--jobs create_file``: file jobs, each on a target of its own) enqueued
beforehand with ``worker(threads=1, batch=100, slow_job=1e9, flush_after=1e9).run_until_idle()``
under ``strace -f -e trace=sendto,recvfrom``, after a warm-up drain of 200 jobs in the same
process; the paused types are read once (``pausing.REFRESH``). A round trip is a turn of one
thread from sending to receiving; the measured drain is told apart by two ``stat`` calls of
marker paths. Prints, for the difference of the two sizes, the worker thread's round trips a
100-job batch (a claim-and-complete cycle) and those of the whole process (the process's first
thread supervises: starts, sweeps and stops).
"""

from __future__ import annotations

import argparse
import collections
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

# Run with a tree's src and tests first on sys.path: fill URL N KIND ROOT | drain URL WARM_URL KIND ROOT.
_CHILD = (
    PG_CHILD_PRELUDE
    + """
kind, root = sys.argv[4], sys.argv[5]
def job(i):
    return CreateFile(path=f"f{i}.json", content=i) if kind == "create_file" else pg_jobtypes.PgNoop(n=i)
if sys.argv[1] == "fill":
    with Coordinator.open(sys.argv[2], root=root, registry=registry) as c:
        c.enqueue_many([job(i) for i in range(int(sys.argv[3]))])
else:
    for url in (sys.argv[3], sys.argv[2]):  # the warm-up, then the measured drain
        with Coordinator.open(url, root=root, registry=registry) as c:
            w = c.worker(threads=1, batch=100, slow_job=1e9, flush_after=1e9)
            os.path.exists("/nonexistent/tether-round-trips-start")
            w.run_until_idle(install_signals=False)
            os.path.exists("/nonexistent/tether-round-trips-end")
"""
)
_CALL = re.compile(r"^(\d+)\s+(?:<\.\.\. )?(sendto|recvfrom|newfstatat|stat)\b")


def child(src: Path, args: list[str], prefix: list[str] | None = None) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(src.parent / "tests")]), "PYTHONHASHSEED": "0"}
    cmd = [*(prefix or []), sys.executable, "-c", _CHILD, *args]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def database(admin: sa.Engine, src: Path, jobs: int, kind: str, root: str) -> str:
    name = "rt_" + secrets.token_hex(4)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    url = ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    child(src, ["fill", url, str(jobs), kind, root])
    return url


def turns(trace: Path) -> collections.Counter[str]:
    """Each thread's turns from sending to receiving between the last two markers (the measured
    drain's; failed non-blocking reads, EAGAIN, are no answer)."""
    counted: collections.Counter[str] = collections.Counter()
    last: dict[str, str] = {}
    on = False
    for line in trace.read_text().splitlines():
        if "tether-round-trips-" in line:
            on = "tether-round-trips-start" in line
            if on:
                counted.clear()
            continue
        found = _CALL.match(line)
        if not on or found is None or found.group(2) not in ("sendto", "recvfrom") or "EAGAIN" in line:
            continue
        if "unfinished" in line:
            continue
        thread, call = found.groups()
        if call == "recvfrom" and last.get(thread) == "sendto":
            counted[thread] += 1
        last[thread] = call
    return counted


def drain(src: Path, jobs: int, kind: str, admin: sa.Engine, scratch: str) -> tuple[int, int]:
    """(worker thread, whole process) round trips of one drain of ``jobs`` after its warm-up."""
    root = tempfile.mkdtemp(dir=scratch)
    url, warm = database(admin, src, jobs, kind, root), database(admin, src, 200, kind, root)
    trace = Path(scratch) / f"strace.{secrets.token_hex(4)}"
    try:
        prefix = ["strace", "-f", "-qq", "-e", "trace=sendto,recvfrom,newfstatat,stat", "-o", str(trace)]
        child(src, ["drain", url, warm, kind, root], prefix)
    finally:
        with admin.connect() as conn:
            for name in (url, warm):
                conn.exec_driver_sql(f"DROP DATABASE {name.rsplit('/', 1)[1]} WITH (FORCE)")
    counted = turns(trace)
    main = trace.read_text().split(None, 1)[0]  # the process's first thread: the supervisor's loop
    return sum(n for thread, n in counted.items() if thread != main), sum(counted.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("others", nargs="*", type=Path, help="other checkouts' src directories")
    parser.add_argument("--small", type=int, default=300)
    parser.add_argument("--big", type=int, default=1500)
    parser.add_argument("--jobs", choices=["pg_noop", "create_file"], default="pg_noop")
    args = parser.parse_args()
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    batches = (args.big - args.small) / 100
    print(f"round trips a 100-job batch ({args.big} - {args.small} {args.jobs} jobs): worker thread | whole process")
    with tempfile.TemporaryDirectory() as scratch:
        for src in [(REPO / "src").resolve(), *(other.resolve() for other in args.others)]:
            thread0, total0 = drain(src, args.small, args.jobs, admin, scratch)
            thread1, total1 = drain(src, args.big, args.jobs, admin, scratch)
            print(f"{src}: {(thread1 - thread0) / batches:.2f} | {(total1 - total0) / batches:.2f}", flush=True)
    admin.dispose()


if __name__ == "__main__":
    main()
