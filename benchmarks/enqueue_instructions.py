"""User-space instructions of one lone durable enqueue, as ``concurrent_enqueue.py --threads 1``
makes it, next to the bare INSERT + COMMIT: callgrind's count of two runs of different sizes,
their difference over the difference in jobs. Unlike wall time, it does not move with the load.

    .venv/bin/python benchmarks/enqueue_instructions.py [--src /work/main/src,src] [--jobs 300,2300]

Each tree in ``--src`` (put first on ``PYTHONPATH``) is run as tether and once as bare, under
``valgrind --tool=callgrind`` with ``PYTHONHASHSEED=0``, on a ledger on tmpfs (``/dev/shm``): the
fsync's wait is not an instruction, and the kernel's work (system calls, a path's lookup) is not
counted either. tether: ``Coordinator.enqueue(CreateFile(...))`` from one thread, the payload
built in the call; bare: the same rows (built beforehand, each with its own id) by plain sqlite3
from one thread, ``BEGIN IMMEDIATE`` + ``INSERT`` + ``COMMIT`` each, as concurrent_enqueue.py's.
``--child SIDE N`` is one run, without valgrind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BARE_INSERT, SCRATCH, bare_connect, bare_row  # noqa: E402

WARM = 5  # calls before the counted ones, as concurrent_enqueue.py makes


def child(side: str, n: int, base: str) -> None:
    from tether import Coordinator, CreateFile

    def payload(i: int) -> CreateFile:
        return CreateFile(path=f"t0/{i}.json", content={"thread": 0, "i": i})

    d = Path(tempfile.mkdtemp(dir=base))
    try:
        if side == "tether":
            with Coordinator.open(f"sqlite:///{d}/ledger.db", root=d / "data") as c:
                _in_a_thread(lambda: [c.enqueue(payload(i)) for i in range(n + WARM)])
            return
        with Coordinator.open(f"sqlite:///{d}/ledger.db", root=d / "data") as c:  # the same table
            one = bare_row(c.queue.build(payload(0)))
        rows = [(one[0][:-8] + f"{i:08d}", *one[1:]) for i in range(n + WARM)]
        conn = bare_connect(d / "ledger.db")

        def insert_all() -> None:
            for row in rows:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(BARE_INSERT, row)
                conn.execute("COMMIT")

        _in_a_thread(insert_all)
        conn.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _in_a_thread(run: Callable[[], object]) -> None:
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def counted(src: str, side: str, n: int, out: Path, base: str) -> int:
    """Instructions of one run of ``n`` jobs by ``side`` with tether from ``src``."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(Path(src).resolve())}
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__]
        + ["--child", side, str(n), "--base", base],
        env=env,
        check=True,
        capture_output=True,
    )
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default="src", help="trees to count, comma-separated (their src/)")
    parser.add_argument("--jobs", default="300,2300", help="the two run sizes")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--base", default="/dev/shm", help="where the ledgers go")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.base)
        return
    small, big = (int(n) for n in args.jobs.split(","))
    SCRATCH.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=SCRATCH) as scratch:
        for src in args.src.split(","):
            for side in ("tether", "bare"):
                a, b = (counted(src, side, n, Path(scratch) / f"{side}.{n}.out", args.base) for n in (small, big))
                print(f"{src:24} {side:6} {(b - a) / (big - small):10,.0f} instructions an enqueue", flush=True)


if __name__ == "__main__":
    main()
