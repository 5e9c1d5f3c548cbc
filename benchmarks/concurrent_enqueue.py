"""Concurrent single durable enqueues: tether's group commit against a bare INSERT + COMMIT per
call, from the same number of threads of one process, in the same run.

    .venv/bin/python benchmarks/concurrent_enqueue.py [--jobs 2400] [--threads 1,4,16,64] [--rounds 3]
        [--backends sqlite,postgres] [--pg-at-once 4] [--batched 16] [--commit-sleep 120]

Per round, thread count and backend, each side runs in a fresh ledger (SQLite: a new file, WAL,
synchronous=FULL as tether uses; PostgreSQL: a new schema of the server at
$TETHER_BENCH_PG_URL), the two sides' order alternating by round:

- tether: ``Coordinator.enqueue(CreateFile(...))`` per call, the job built and validated in the
  call, from N threads sharing one coordinator.
- bare: the same row (built by tether beforehand, outside the timing) inserted with a plain
  ``INSERT`` and ``COMMIT`` per call, one connection per thread: sqlite3 set up as tether's
  (``BEGIN IMMEDIATE`` first, SQLite's own busy handler for waits), or psycopg.

Each thread makes a few untimed calls first (connections opened), then all start together at a
barrier; jobs/s is jobs over the wall time from the barrier to the last thread's end, and p50 /
p99 are of every call's latency, and cs/job the process's voluntary context switches per job
(a thread that blocks: on a lock, the GIL, the disk). For tether's sides, jobs/commit and commit
ms are of the group commit's transactions (their count, and the median wall time each took from
its leader's start: what the GIL lets it have of the CPU included). ``--batched N`` adds a side
that enqueues the same jobs from one thread, N at a time with ``enqueue_many``: what a shared
commit costs a job with no thread to hand it between. ``--commit-sleep US`` adds a side whose group
commit does no database work: it sleeps US microseconds (about a durable commit's wall time here)
and hands each caller its results, so the side shows what the same threads and group make when a
commit costs no CPU (the statement's and the fsync's are the kernel's and SQLite's, on the same
cores as the callers). Figures are medians over rounds. ``--pg-at-once`` lists the
numbers of group commits a process runs at once on PostgreSQL to measure (tether's default is
the backend's ``commits_at_once``; a number at least the thread count means no grouping: every
caller commits alone, the server's own commit grouping left to share the fsyncs).
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BARE_INSERT, SCRATCH, bare_connect, bare_row, machine, percentile, scratch  # noqa: E402

PG_URL = os.environ.get("TETHER_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
WARM = 5  # untimed calls per thread before the barrier


def _payload(thread: int, i: int) -> Any:
    from tether import CreateFile

    return CreateFile(path=f"t{thread}/{i}.json", content={"thread": thread, "i": i})


def _drive(
    threads: int, per_thread: int, call: Callable[[int, int], None], commits: list[float] | None = None
) -> dict[str, float]:
    """``call(thread, i)`` per_thread times from each of ``threads`` threads, started together;
    ``commits``: filled with the wall time of each group commit (``_timed_commits``)."""
    barrier = threading.Barrier(threads + 1)
    samples: list[list[float]] = [[] for _ in range(threads)]
    failed: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for i in range(WARM):
                call(k, per_thread + i)
            barrier.wait()
            mine = samples[k]
            for i in range(per_thread):
                start = time.perf_counter()
                call(k, i)
                mine.append(time.perf_counter() - start)
        except BaseException as e:  # reported below, after the others end
            failed.append(e)
            barrier.abort()

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    if commits is not None:
        commits.clear()  # the warm-up's
    start, cpu, switches = time.perf_counter(), time.process_time(), _switches()
    for w in workers:
        w.join()
    wall, cpu, switches = time.perf_counter() - start, time.process_time() - cpu, _switches() - switches
    if failed:
        raise failed[0]
    every = [s for mine in samples for s in mine]
    figures = {
        "jobs_s": len(every) / wall,
        "p50": percentile(every, 0.5) * 1e3,
        "p99": percentile(every, 0.99) * 1e3,
        "cpu_us": cpu / len(every) * 1e6,  # this process's CPU (all threads) per job
        "cs": switches / len(every),
    }
    if commits:
        figures["per_commit"] = len(every) / len(commits)
        figures["commit_ms"] = statistics.median(commits) * 1e3
    return figures


def _switches() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def _timed_commits(coordinator: Any) -> list[float] | None:
    """The wall time of each of ``coordinator``'s group commits, appended as they end (None for
    a tree without group commit)."""
    group = getattr(coordinator.queue.enqueuer, "group", None)
    if group is None:
        return None
    took: list[float] = []
    commit = group._commit

    def timed(batch: Any) -> None:
        start = time.perf_counter()
        try:
            commit(batch)
        finally:
            took.append(time.perf_counter() - start)

    group._commit = timed
    return took


# -- SQLite -------------------------------------------------------------------------------------


def sqlite_tether(threads: int, per_thread: int) -> dict[str, float]:
    from tether import Coordinator

    with scratch(SCRATCH, "concurrent") as d, Coordinator.open(f"sqlite:///{d}/ledger.db", root=d / "data") as c:
        return _drive(threads, per_thread, lambda k, i: c.enqueue(_payload(k, i)), _timed_commits(c))


def sqlite_commit_sleep(pause_us: int, threads: int, per_thread: int) -> dict[str, float]:
    """``sqlite_tether`` with each group commit replaced by a sleep of ``pause_us`` that writes
    nothing: what the group commit makes of these threads when a commit takes no CPU."""
    from tether import Coordinator
    from tether.ledger.record import InsertResult

    def commit(batch: Any) -> None:
        time.sleep(pause_us / 1e6)
        for request in batch:
            request.results = [InsertResult(job) for job in request.jobs]

    with scratch(SCRATCH, "concurrent-sleep") as d, Coordinator.open(f"sqlite:///{d}/ledger.db", root=d / "data") as c:
        c.queue.enqueuer.group._commit = commit
        return _drive(threads, per_thread, lambda k, i: c.enqueue(_payload(k, i)), _timed_commits(c))


def sqlite_batched(size: int, jobs: int) -> dict[str, float]:
    """The same jobs from one thread, ``size`` at a time by ``enqueue_many``: the latency figures
    are of a call, the others of a job."""
    from tether import Coordinator

    with (
        scratch(SCRATCH, "concurrent-batched") as d,
        Coordinator.open(f"sqlite:///{d}/ledger.db", root=d / "data") as c,
    ):
        calls = max(1, jobs // size)
        figures = _drive(1, calls, lambda k, i: c.enqueue_many([_payload(n, i) for n in range(size)]))
        figures["jobs_s"] *= size
        figures["cpu_us"] /= size
        figures["cs"] /= size
        return figures


def sqlite_bare(threads: int, per_thread: int) -> dict[str, float]:
    from tether import Coordinator

    with scratch(SCRATCH, "concurrent-bare") as d:
        with Coordinator.open(f"sqlite:///{d}/ledger.db", root=d / "data") as c:  # the same table
            rows = {
                (k, i): bare_row(c.queue.build(_payload(k, i)))
                for k in range(threads)
                for i in range(per_thread + WARM)
            }
        local = threading.local()

        def insert(k: int, i: int) -> None:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = bare_connect(d / "ledger.db")
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(BARE_INSERT, rows[k, i])
            conn.execute("COMMIT")

        return _drive(threads, per_thread, insert)


# -- PostgreSQL ---------------------------------------------------------------------------------


@contextmanager
def pg_schema() -> Iterator[str]:
    import psycopg

    schema = f"bench_{secrets.token_hex(4)}"
    try:
        yield schema
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def pg_tether(threads: int, per_thread: int, at_once: int) -> dict[str, float]:
    from tether import Coordinator

    with scratch(SCRATCH, "concurrent-pg") as d, pg_schema() as schema:
        with Coordinator.open(PG_URL, root=d / "data", schema=schema) as c:
            if hasattr(c.queue.enqueuer, "group"):  # a tree from before group commit has none
                c.queue.backend.commits_at_once = c.queue.enqueuer.group.at_once = at_once
            return _drive(threads, per_thread, lambda k, i: c.enqueue(_payload(k, i)), _timed_commits(c))


PG_BARE_INSERT = BARE_INSERT.replace("?", "%s")


def pg_bare(threads: int, per_thread: int) -> dict[str, float]:
    import psycopg

    from tether import Coordinator

    with scratch(SCRATCH, "concurrent-pg-bare") as d, pg_schema() as schema:
        with Coordinator.open(PG_URL, root=d / "data", schema=schema) as c:  # the same table
            built = {(k, i): c.queue.build(_payload(k, i)) for k in range(threads) for i in range(per_thread + WARM)}
        rows = {key: bare_row(job, time=_as_is) for key, job in built.items()}  # psycopg binds datetimes
        conns = [psycopg.connect(PG_URL, options=f"-csearch_path={schema}") for _ in range(threads)]
        try:

            def insert(k: int, i: int) -> None:
                conn = conns[k]
                conn.execute(PG_BARE_INSERT, rows[k, i])
                conn.commit()

            return _drive(threads, per_thread, insert)
        finally:
            for conn in conns:
                conn.close()


def _as_is(value: Any) -> Any:
    return value


# -- the run ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2400, help="timed enqueues per measurement (split over threads)")
    parser.add_argument("--threads", default="1,4,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-at-once", default="", help="group commits at once on PostgreSQL (default: tether's)")
    parser.add_argument(
        "--commit-sleep", type=int, default=0, help="also a side whose commits sleep US microseconds, writing nothing"
    )
    parser.add_argument(
        "--batched", type=int, default=0, help="also enqueue_many of N jobs a call from one thread (SQLite)"
    )
    args = parser.parse_args()
    counts = [int(n) for n in args.threads.split(",")]
    backends = args.backends.split(",")
    from tether.ledger.postgresql import PostgresBackend

    default = getattr(PostgresBackend, "commits_at_once", 1)
    at_onces = [int(n) for n in args.pg_at_once.split(",")] if args.pg_at_once else [default]
    print(machine())
    print(f"load at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sides: dict[str, Callable[[int, int], dict[str, float]]] = {}
    if "sqlite" in backends:
        sides["sqlite tether"] = sqlite_tether
        sides["sqlite bare"] = sqlite_bare
        if args.commit_sleep:
            sides[f"sqlite commit sleeps {args.commit_sleep} us"] = lambda t, p: sqlite_commit_sleep(
                args.commit_sleep, t, p
            )
        if args.batched:
            sides[f"sqlite tether batched {args.batched}"] = lambda t, p: sqlite_batched(args.batched, t * p)
    if "postgres" in backends:
        for n in at_onces:
            sides[f"pg tether at_once={n}"] = lambda t, p, n=n: pg_tether(t, p, n)
        sides["pg bare"] = pg_bare
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for threads in counts:
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                figures = sides[side](threads, max(1, args.jobs // threads))
                got.setdefault((side, threads), []).append(figures)
                print(
                    f"round {r + 1} {side:24} {threads:3} threads: {figures['jobs_s']:8,.0f} jobs/s"
                    f"  p50 {figures['p50']:.3f} ms  p99 {figures['p99']:.3f} ms  CPU {figures['cpu_us']:.0f} us/job"
                    f"  {figures['cs']:.1f} cs/job",
                    flush=True,
                )
    print(f"load at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    report(got, list(sides), counts)


def report(got: dict[tuple[str, int], list[dict[str, float]]], sides: list[str], counts: list[int]) -> None:
    def med(side: str, threads: int, figure: str) -> float:
        return statistics.median(f[figure] for f in got[side, threads])

    def grouped(side: str, threads: int) -> str:
        if "commit_ms" not in got[side, threads][0]:
            return " | |"
        return f" {med(side, threads, 'per_commit'):.1f} | {med(side, threads, 'commit_ms'):.3f} |"

    print("\nmedians over rounds (batched: one thread whatever the count, p50 and p99 of a call)")
    print(
        "| side | threads | jobs/s | p50 ms | p99 ms | CPU µs/job | cs/job | jobs/commit | commit ms |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for side in sides:
        for n in counts:
            jobs_s, p50, p99, cpu, cs = (med(side, n, figure) for figure in ("jobs_s", "p50", "p99", "cpu_us", "cs"))
            print(f"| {side} | {n} | {jobs_s:,.0f} | {p50:.3f} | {p99:.3f} | {cpu:.0f} | {cs:.1f} |" + grouped(side, n))
    print()
    if "sqlite tether" in sides and 1 in counts:
        one = med("sqlite tether", 1, "jobs_s")
        for n in counts:
            print(
                f"sqlite {n:2} threads: tether {med('sqlite tether', n, 'jobs_s') / one:.2f}x its 1 thread, "
                f"{med('sqlite tether', n, 'jobs_s') / med('sqlite bare', n, 'jobs_s'):.2f}x bare jobs/s; "
                f"p99 {med('sqlite tether', n, 'p99'):.2f} ms"
            )
        print(
            f"sqlite 1 thread: tether p50 / bare p50 = "
            f"{med('sqlite tether', 1, 'p50') / med('sqlite bare', 1, 'p50'):.2f}x (target <= 1.25x); "
            + (
                f"16 threads / 1 thread = {med('sqlite tether', 16, 'jobs_s') / one:.2f}x (target >= 5x), "
                f"p99 {med('sqlite tether', 16, 'p99'):.2f} ms (target <= 3 ms)"
                if 16 in counts
                else ""
            )
        )
    for side in sides:
        if side.startswith("sqlite commit sleeps") and 1 in counts:
            alone = med(side, 1, "jobs_s")
            print(", ".join(f"{side} {n} threads: {med(side, n, 'jobs_s') / alone:.2f}x its 1 thread" for n in counts))
    for side in sides:
        if side.startswith("pg tether") and "pg bare" in sides:
            for n in counts:
                print(
                    f"{side} {n:2} threads: {med(side, n, 'jobs_s') / med('pg bare', n, 'jobs_s'):.2f}x bare jobs/s, "
                    f"p50 {med(side, n, 'p50') / med('pg bare', n, 'p50'):.2f}x bare p50"
                )
    print("targets (PostgreSQL): 1 thread p50 <= 1.3x bare; 16 threads jobs/s >= 0.8x bare")


if __name__ == "__main__":
    main()
