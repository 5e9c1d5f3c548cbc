"""An application that enqueues single jobs, one after another, until its stdin closes; as
tests/test_lost_connections.py runs it while terminating its database connections.

Usage: python tests/proc_enqueuer.py DB_URL ROOT

Stdout, one line per enqueue: ``ok ID`` (returned), ``refused PATH`` (DatabaseUnavailable: nothing
was enqueued), ``unknown ID`` (CommitUnknown). Stderr: tether's events, one JSON line each, and
whatever else the libraries print: logging is left as an application that configures none has it.
"""

from __future__ import annotations

import sys
import threading

from tether import CommitUnknown, Coordinator, CreateFile, DatabaseUnavailable, events


def main(db_url: str, root: str) -> int:
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with events.to_stderr(), Coordinator.open(db_url, root=root) as c:
        n = 0
        while not stop.is_set():
            n += 1
            path = f"f{n}.json"
            try:
                job = c.enqueue(CreateFile(path=path, content={"n": n})).job
            except CommitUnknown as e:
                print("unknown", *e.job_ids, flush=True)
            except DatabaseUnavailable:
                print("refused", path, flush=True)
            else:
                print("ok", job.id, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
