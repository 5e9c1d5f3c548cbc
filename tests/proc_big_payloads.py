"""Large payloads in a process of their own, for tests/test_payload_memory.py.

    python tests/proc_big_payloads.py enqueue DB_URL ROOT JOBS MIB   # JOBS create_file jobs of MIB MiB of text
    python tests/proc_big_payloads.py drain DB_URL ROOT              # one worker thread until idle
    python tests/proc_big_payloads.py claim DB_URL ROOT              # claim one job, run nothing

``drain`` prints one JSON line: the jobs it ran, and this process's peak RSS (``ru_maxrss``) just
before the drain and after it, in bytes; ``claim`` the same, with the claimed payload's length
in ``ran``. The enqueue runs in another process, so the drain's peak
is its own. Both write with durability ``normal``: what is measured is memory, not fsync.
"""

from __future__ import annotations

import json
import resource
import sys

from tether import Coordinator, CreateFile


def enqueue(db_url: str, root: str, jobs: int, mib: int) -> None:
    with Coordinator.open(db_url, root=root, durability="normal") as c:
        text = "x" * (mib << 20)
        for i in range(jobs):
            c.enqueue(CreateFile(path=f"big/{i}.txt", text=text))


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def drain(db_url: str, root: str) -> None:
    with Coordinator.open(db_url, root=root, durability="normal") as c:
        before = _peak()
        ran = c.run_until_idle(threads=1)
        print(json.dumps({"ran": ran, "before": before, "after": _peak()}), flush=True)


def claim(db_url: str, root: str) -> None:
    with Coordinator.open(db_url, root=root, durability="normal") as c:
        before = _peak()
        [job] = c.queue.claim("memory-test", limit=1)
        print(json.dumps({"ran": len(job.payload), "before": before, "after": _peak()}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "enqueue":
        enqueue(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "claim":
        claim(sys.argv[2], sys.argv[3])
    else:
        drain(sys.argv[2], sys.argv[3])
