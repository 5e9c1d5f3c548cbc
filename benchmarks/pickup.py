"""Issue 7, target 3: how soon an idle worker starts a new job, and what it costs while idle.

    .bench/venv-anchors/bin/python benchmarks/pickup.py [--samples 50] [--idle 10]

Cross-process: ``tether worker`` (default 1 s poll) runs in a child process, importing this module
for its job type; this process enqueues one job at a time, spaced by a random 0.05-1.5 s, and the
latency is the handler's ``time.time()`` (its result) minus ``time.time()`` when ``enqueue``
returned here. Same process: a ``Worker.run()`` thread and ``Coordinator.enqueue`` in this thread,
latency by ``perf_counter``. Idle CPU: the child's utime + stime from /proc/<pid>/stat over
``--idle`` seconds with nothing enqueued, as % of one core.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from _common import SCRATCH, bare_connect, machine, median, percentile, scratch
from tether import Coordinator, JobContext, JobType, Payload
from tether.jobtypes import default_registry

HERE = Path(__file__).resolve().parent


class Stamp(Payload):
    """A job whose handler records when it started."""

    job_type: ClassVar[str] = "bench_stamp"
    n: int


class StampType(JobType[Stamp]):
    name = "bench_stamp"
    payload_model = Stamp
    started: ClassVar[dict[int, float]] = {}  # same-process runs: n -> perf_counter at handler start
    event: ClassVar[threading.Event] = threading.Event()

    def run(self, payload: Stamp, ctx: JobContext) -> dict[str, float]:
        now, wall = time.perf_counter(), time.time()
        StampType.started[payload.n] = now
        StampType.event.set()
        return {"t": wall}


def register(registry: Any) -> None:
    """Called by ``tether --import pickup`` in the worker process."""
    registry.register(StampType())


def open_ledger(d: Path) -> Coordinator:
    registry = default_registry()
    register(registry)
    return Coordinator.open(f"sqlite:///{d}/ledger.db", root=d / "data", registry=registry, durability="full")


def _wait_result(c: Coordinator, job_id: str, deadline: float = 15.0) -> float:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        rec = c.get(job_id)
        if rec.status.value == "completed":
            return float(rec.result_data["t"])
        time.sleep(0.002)
    raise RuntimeError(f"job {job_id} not completed within {deadline} s (status {rec.status.value})")


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (fields 14 and 15 of /proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def cross_process(d: Path, samples: int, idle: float, rng: random.Random) -> tuple[list[float], float]:
    c = open_ledger(d)
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [
        sys.executable,
        "-m",
        "tether",
        "--db",
        f"sqlite:///{d}/ledger.db",
        "--root",
        str(d / "data"),
        "--import",
        "pickup",
        "worker",
        "--quiet",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_result(c, c.enqueue(Stamp(n=-1)).job.id, deadline=60.0)  # the worker is up and idle
        lat = []
        for i in range(samples):
            time.sleep(rng.uniform(0.05, 1.5))
            r = c.enqueue(Stamp(n=i))
            t_enq = time.time()
            lat.append(_wait_result(c, r.job.id) - t_enq)
        time.sleep(1.0)  # let the last group commit and any wake-up settle
        tck = os.sysconf("SC_CLK_TCK")
        t0, w0 = cpu_ticks(proc.pid), time.monotonic()
        time.sleep(idle)
        cpu = (cpu_ticks(proc.pid) - t0) / tck / (time.monotonic() - w0)
        return lat, cpu
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode not in (0, -15):
            print(f"worker exited {proc.returncode}: {err.decode()[-2000:]}", file=sys.stderr)
        c.close()


def same_process(d: Path, samples: int, rng: random.Random) -> tuple[list[float], list[float]]:
    """Pickup latencies, and next to each a bare BEGIN IMMEDIATE + INSERT + COMMIT on the same
    disk: the claim is a durable commit too, so one fsync'd commit is the floor."""
    c = open_ledger(d)
    bare = bare_connect(d / "bare.db")
    bare.execute("CREATE TABLE t (n INTEGER)")
    floor = []
    w = c.worker(threads=1)
    t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
    t.start()
    lat = []
    try:
        for i in range(-1, samples):
            time.sleep(rng.uniform(0.05, 1.5) if i >= 0 else 0.2)
            t0 = time.perf_counter()
            bare.execute("BEGIN IMMEDIATE")
            bare.execute("INSERT INTO t VALUES (?)", (i,))
            bare.execute("COMMIT")
            floor.append(time.perf_counter() - t0)
            StampType.event.clear()
            c.enqueue(Stamp(n=i))
            t_enq = time.perf_counter()
            if not StampType.event.wait(15.0):
                raise RuntimeError(f"job {i} not started within 15 s")
            if i >= 0:
                lat.append(StampType.started[i] - t_enq)
    finally:
        w.stop()
        t.join(timeout=15)
        c.close()
        bare.close()
    return lat, floor[1:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measurement")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--dir", type=Path, default=SCRATCH)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"issue 7 pickup benchmark, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    base = args.dir.resolve()
    with scratch(base, "pickup-x") as d:
        x_lat, cpu = cross_process(d, args.samples, args.idle, rng)
    with scratch(base, "pickup-s") as d:
        s_lat, floor = same_process(d, args.samples, rng)
    rows = []
    for name, lat, target in (
        ("cross-process (tether worker, poll 1 s)", x_lat, 25.0),
        ("same process (worker thread)", s_lat, 2.0),
    ):
        p50, p95, worst = percentile(lat, 0.5) * 1e3, percentile(lat, 0.95) * 1e3, max(lat) * 1e3
        rows.append(
            f"| pickup {name} | p50 {p50:.2f} ms, p95 {p95:.2f} ms, max {worst:.1f} ms, n={len(lat)} "
            f"| p95 <= {target:g} ms | {'PASS' if p95 <= target else 'FAIL'} |"
        )
    rows.append(
        f"| bare INSERT + COMMIT (fsync floor, same disk, interleaved with the same-process samples) | "
        f"p50 {percentile(floor, 0.5) * 1e3:.2f} ms, p95 {percentile(floor, 0.95) * 1e3:.2f} ms | - | - |"
    )
    rows.append(
        f"| idle worker CPU over {args.idle:g} s | {cpu * 100:.2f}% of a core | < 1% | "
        f"{'PASS' if cpu < 0.01 else 'FAIL'} |"
    )
    print("\n| figure | measured | target | met |\n| --- | --- | --- | --- |")
    print("\n".join(rows))
    print(
        f"\nmedian cross-process {median(x_lat) * 1e3:.2f} ms; load average now "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
