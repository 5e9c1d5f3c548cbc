"""The event loop while 200 tasks enqueue (tether.aio), beside the sync enqueue from a thread pool.

    .venv/bin/python benchmarks/async_enqueue.py [--tasks 200] [--per-task 10] [--rounds 5] [--threads 8]

Three sides, each on a fresh SQLite ledger (WAL, synchronous=FULL), ``create_file`` jobs on
distinct paths, the sides' order rotated from round to round; medians over rounds:

- ``async``: ``--tasks`` asyncio tasks each ``await AsyncCoordinator.enqueue`` ``--per-task`` times
  (the coordinator's pool has ``--threads`` threads), while a ticker task sleeps 1 ms at a time and
  records how late it woke: the loop's stall. Its longest stall is the figure the issue bounds (5 ms).
- ``threads``: the same jobs through the sync ``Coordinator.enqueue`` from a
  ``ThreadPoolExecutor`` of ``--threads`` threads, no event loop: the baseline rate and latency.
- ``in-loop``: the tasks call the sync enqueue inside the loop (what the async API is for
  avoiding), with the same ticker: each commit stalls the loop.

``idle`` is the ticker alone on an idle loop: the lateness the loop's timer has with no work.
``max busy`` is the most CPU time the loop's thread used between two ticks: the loop's own
work. A stall far longer than that was spent waiting for a core (other processes on a shared
machine) or for the GIL (the pool's threads).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import SCRATCH, machine, scratch
from tether import AsyncCoordinator, Coordinator
from tether.jobtypes import CreateFile

TICK = 0.001


def payload(task: int, i: int) -> CreateFile:
    return CreateFile(path=f"t{task}/{i}.json", content={"task": task, "i": i, "note": "x" * 64})


async def _ticker(stop: asyncio.Event, lateness: list[float], busy: list[float]) -> None:
    """Sleep TICK at a time until ``stop``; record how much later than TICK each wake-up came, and
    the CPU time the loop's thread used meanwhile (its own work: tasks' steps, callbacks). A stall
    much longer than its CPU time was spent waiting: for a core (other processes) or the GIL."""
    while not stop.is_set():
        before, cpu = time.perf_counter(), time.thread_time()
        await asyncio.sleep(TICK)
        lateness.append(time.perf_counter() - before - TICK)
        busy.append(time.thread_time() - cpu)


async def _with_ticker(work: Callable[[], Awaitable[None]]) -> tuple[list[float], list[float]]:
    lateness: list[float] = []
    busy: list[float] = []
    stop = asyncio.Event()
    ticking = asyncio.create_task(_ticker(stop, lateness, busy))
    await asyncio.sleep(0.05)  # the ticker is running before the work starts
    del lateness[:], busy[:]
    await work()
    stop.set()
    await ticking
    return lateness, busy


async def _gather_timed(
    one: Callable[[int], Awaitable[None]], tasks: int
) -> tuple[float, tuple[list[float], list[float]]]:
    """Run ``one(task)`` for ``tasks`` tasks at once on the loop, under the ticker: the seconds they
    took together, and the ticker's lateness and busy records (run_async and run_in_loop)."""

    async def work() -> None:
        await asyncio.gather(*(one(t) for t in range(tasks)))

    t0 = time.perf_counter()
    ticks = await _with_ticker(work)
    return time.perf_counter() - t0, ticks


def _summary(latencies: list[float], seconds: float, ticks: tuple[list[float], list[float]] | None) -> dict[str, Any]:
    latencies.sort()
    out = {
        "jobs_per_s": len(latencies) / seconds if latencies else None,
        "p50_ms": latencies[len(latencies) // 2] * 1e3 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3 if latencies else None,
    }
    if ticks is not None:
        lateness, busy = sorted(ticks[0]), sorted(ticks[1])
        out["stall_max_ms"] = lateness[-1] * 1e3
        out["stall_p99_ms"] = lateness[int(len(lateness) * 0.99)] * 1e3
        out["busy_max_ms"] = busy[-1] * 1e3
    return out


def run_async(url: str, root: Path, tasks: int, per_task: int, threads: int) -> dict[str, Any]:
    latencies: list[float] = []

    async def main() -> tuple[float, tuple[list[float], list[float]]]:
        async with await AsyncCoordinator.open(url, root=root, threads=threads) as c:

            async def one(task: int) -> None:
                for i in range(per_task):
                    t0 = time.perf_counter()
                    await c.enqueue(payload(task, i))
                    latencies.append(time.perf_counter() - t0)

            return await _gather_timed(one, tasks)

    seconds, ticks = asyncio.run(main())
    return _summary(latencies, seconds, ticks)


def run_in_loop(url: str, root: Path, tasks: int, per_task: int) -> dict[str, Any]:
    latencies: list[float] = []

    async def main() -> tuple[float, tuple[list[float], list[float]]]:
        with Coordinator.open(url, root=root) as c:

            async def one(task: int) -> None:
                for i in range(per_task):
                    t0 = time.perf_counter()
                    c.enqueue(payload(task, i))  # blocks the loop for the commit
                    latencies.append(time.perf_counter() - t0)
                    await asyncio.sleep(0)

            return await _gather_timed(one, tasks)

    seconds, ticks = asyncio.run(main())
    return _summary(latencies, seconds, ticks)


def run_threads(url: str, root: Path, tasks: int, per_task: int, threads: int) -> dict[str, Any]:
    latencies: list[float] = []
    lock = threading.Lock()
    with Coordinator.open(url, root=root) as c:

        def one(task: int) -> None:
            for i in range(per_task):
                t0 = time.perf_counter()
                c.enqueue(payload(task, i))
                took = time.perf_counter() - t0
                with lock:
                    latencies.append(took)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, range(tasks)))
        seconds = time.perf_counter() - t0
    return _summary(latencies, seconds, None)


def run_idle(seconds: float) -> dict[str, Any]:
    async def main() -> tuple[list[float], list[float]]:
        return await _with_ticker(lambda: asyncio.sleep(seconds))

    return _summary([], seconds, asyncio.run(main()))


def measure(side: str, args: argparse.Namespace) -> dict[str, Any]:
    with scratch(SCRATCH, f"async-{side}") as tmp:
        url, root = f"sqlite:///{tmp / 'tether.db'}", tmp / "data"
        Coordinator.open(url, root=root).close()  # the ledger exists before the clock starts
        gc.collect()
        if side == "async":
            return run_async(url, root, args.tasks, args.per_task, args.threads)
        if side == "threads":
            return run_threads(url, root, args.tasks, args.per_task, args.threads)
        if side == "in-loop":
            return run_in_loop(url, root, args.tasks, args.per_task)
        return run_idle(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--per-task", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    print(machine())
    print(
        f"load before: {os.getloadavg()[0]:.2f}; {args.tasks} tasks x {args.per_task} enqueues, {args.threads} threads"
    )
    sides = ["async", "threads", "in-loop", "idle"]
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for r in range(args.rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        for side in order:
            results[side].append(measure(side, args))
        last = {s: results[s][-1] for s in sides}
        row = ", ".join(
            f"{s} {last[s].get('jobs_per_s') or 0:,.0f}/s max stall {last[s]['stall_max_ms']:.2f} ms"
            f" (busy {last[s]['busy_max_ms']:.2f})"
            if "stall_max_ms" in last[s]
            else f"{s} {last[s]['jobs_per_s']:,.0f}/s"
            for s in sides
        )
        print(f"round {r + 1}: {row}")
    print(f"\nmedians over {args.rounds} rounds (load after: {os.getloadavg()[0]:.2f})")
    heads = ("jobs/s", "p50 ms", "p99 ms", "max stall ms", "p99 stall ms", "worst", "max busy ms")
    print(f"{'side':8} " + " ".join(f"{h:>{w}}" for h, w in zip(heads, (8, 7, 7, 13, 13, 7, 12), strict=True)))
    for side in sides:
        rows = results[side]

        def med(key: str, rows: list[dict[str, Any]] = rows) -> str:
            values = [row[key] for row in rows if row.get(key) is not None]
            return f"{statistics.median(values):,.2f}" if values else "-"

        worst = max((row.get("stall_max_ms") or 0) for row in rows)
        print(
            f"{side:8} {med('jobs_per_s'):>8} {med('p50_ms'):>7} {med('p99_ms'):>7} "
            f"{med('stall_max_ms'):>13} {med('stall_p99_ms'):>13} {worst:>7.2f} {med('busy_max_ms'):>12}"
        )


if __name__ == "__main__":
    main()
