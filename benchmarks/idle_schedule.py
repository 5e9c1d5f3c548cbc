"""An idle ``tether worker`` with and without a schedule: CPU share of one core (issue 20).

Each worker process runs ``--poll-interval 1`` (the default) on its own SQLite ledger for
SECONDS, side by side; CPU is its user+system time from /proc. The schedule (hourly) is never
due, so the difference is the cost of the one due-check query per poll.

Usage: .venv/bin/python benchmarks/idle_schedule.py [SECONDS]   (default 30)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _common import REPO, SCRATCH, scratch

MODULE = """
from tether import CreateFile
def register(registry): pass
def schedules(coordinator):
    coordinator.schedule("hourly", "0 * * * *", CreateFile(path="h.json", content={}))
"""
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def main(seconds: float) -> None:
    tether = str(Path(sys.executable).with_name("tether"))
    with scratch(SCRATCH, "idle") as work:
        (work / "idle_sched.py").write_text(MODULE)
        procs = {}
        for label, extra in (("no schedule", []), ("one schedule", ["--import", "idle_sched"])):
            (work / label.replace(" ", "_")).mkdir()
            db = f"sqlite:///{work / label.replace(' ', '_') / 'tether.db'}"
            argv = [tether, "--db", db, "--root", str(work / label.replace(" ", "_")), *extra, "worker", "-q"]
            env = {**os.environ, "PYTHONPATH": str(work)}
            subprocess.run([*argv[:5], "init"], env=env, check=True, stdout=subprocess.DEVNULL)
            procs[label] = subprocess.Popen(argv, cwd=work, env=env, stderr=subprocess.DEVNULL)
        time.sleep(5)  # past start-up (imports, schema)
        before = {label: cpu_seconds(p.pid) for label, p in procs.items()}
        time.sleep(seconds)
        for label, p in procs.items():
            used = cpu_seconds(p.pid) - before[label]
            print(f"{label:>13}: {used:.2f} s CPU in {seconds:.0f} s = {100 * used / seconds:.2f}% of a core")
            p.send_signal(signal.SIGTERM)
            p.wait()
    print(f"(ledgers under {SCRATCH.relative_to(REPO)}, removed; CPU from /proc, {TICKS} ticks/s)")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0)
