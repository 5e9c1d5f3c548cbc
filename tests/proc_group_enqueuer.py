"""An application whose 16 threads each enqueue single jobs, one after another, until the process
is killed; as tests/test_group_commit.py runs it (and SIGKILLs it mid-run).

Usage: python tests/proc_group_enqueuer.py DB_URL ROOT

Every seventh job of a thread carries ``{"reject": true}``, which a trigger the test installs
refuses. Stdout, one line per enqueue, written whole and flushed before the next: ``ok ID``
(returned), ``raised PATH`` (the enqueue raised).
"""

from __future__ import annotations

import os
import sys
import threading

from tether import Coordinator, CreateFile

THREADS = 16
_out = threading.Lock()


def say(line: str) -> None:
    with _out:  # one write per line: lines of two threads never interleave
        os.write(1, (line + "\n").encode())


def enqueue_forever(c: Coordinator, thread: int) -> None:
    n = 0
    while True:
        n += 1
        path = f"t{thread}/{n}.json"
        try:
            job = c.enqueue(CreateFile(path=path, content={"reject": True} if n % 7 == 0 else {"n": n})).job
        except Exception:
            say(f"raised {path}")
        else:
            say(f"ok {job.id}")


def main(db_url: str, root: str) -> int:
    c = Coordinator.open(db_url, root=root)
    threads = [threading.Thread(target=enqueue_forever, args=(c, k), daemon=True) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
