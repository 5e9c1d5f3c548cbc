"""An application script as tests/test_processes.py runs it in a subprocess: enqueue a job, drain
the queue with ``Coordinator.run_until_idle()``, then go on with its own work and receive a signal.

Usage: python tests/proc_runner.py DB_URL ROOT SIGNAL_NAME

After the drain, the script sends itself SIGNAL_NAME. A worker's signal handlers belong to the
worker's run: once it returned, the signal must act as it would have before (SIGTERM ends the
process, SIGINT raises KeyboardInterrupt). If the signal is swallowed, the script exits 3.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from tether import Coordinator, CreateFile


def main(db_url: str, root: str, signal_name: str) -> int:
    with Coordinator.open(db_url, root=root) as c:
        c.enqueue(CreateFile(path="runner.json", content={"ran": True}))
        ran = c.run_until_idle()
    print(f"ran {ran}", flush=True)
    os.kill(os.getpid(), signal.Signals[signal_name])
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # the handler, if any, runs between these bytecodes
        time.sleep(0.01)
    print(f"{signal_name} was swallowed after run_until_idle returned", file=sys.stderr, flush=True)
    return 3


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
