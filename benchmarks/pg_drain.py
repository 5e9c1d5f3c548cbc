"""Drain throughput on PostgreSQL: tether with 1, 4 and 8 worker processes, next to pgqueuer.

    .venv/bin/python benchmarks/pg_drain.py [--jobs 3000] [--workers 1,4,8] [--runs 3]

Per run and worker count, both systems drain the same number of no-op jobs on the same server,
each in a fresh database of its own, interleaved (the side that goes first alternates per run).
The worker processes are started first and waited for (each connects under its own
application_name); only then are all jobs enqueued in one transaction, so process start-up
(imports) never competes with the drain for the 2 cores.

- tether: N ``tether worker --quiet --poll-interval 0.05`` processes (job type ``pg_noop`` from
  tests/pg_jobtypes.py; the CLI defaults otherwise), stopped with SIGTERM once all jobs completed.
- pgqueuer: installed from PyPI into its own venv (.bench/venv-pgq, created on first use, never
  the project's venv); N processes run ``QueueManager.run()`` with a no-op entrypoint at its
  defaults (batch size 10), stopped once all jobs succeeded.

Throughput is jobs / drain window, the window read from each system's own ledger: from the first
claim to the last recorded completion (tether: min(claimed_at)..max(completed_at); pgqueuer:
first 'picked' to last 'successful' row of pgqueuer_log). Figures are medians over runs; the
ratio is tether / pgqueuer.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
VENV_PGQ = REPO / ".bench" / "venv-pgq"
PGQUEUER = "pgqueuer==1.6.0"
TETHER = Path(sys.executable).with_name("tether")
ADMIN_URL = os.environ.get("TETHER_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

# The pgqueuer side, run by the pgqueuer venv's python: install | enqueue N | drain.
PGQ_SCRIPT = r"""
import asyncio, sys
import psycopg
from pgqueuer import PsycopgDriver, Queries, QueueManager

async def main(dsn, cmd, n):
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    queries = Queries(PsycopgDriver(conn))
    if cmd == "install":
        await queries.install()
    elif cmd == "enqueue":
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    else:
        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job):
            return None

        await qm.run()
    await conn.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def ensure_pgqueuer_venv() -> Path:
    """The benchmark's own environment with pgqueuer from PyPI; created once."""
    python = VENV_PGQ / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV_PGQ} with {PGQUEUER} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV_PGQ)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", PGQUEUER, "psycopg[binary]>=3.1"], check=True)
    script = VENV_PGQ / "pgq_side.py"
    script.write_text(PGQ_SCRIPT)
    return python


@contextmanager
def fresh_database(label: str) -> Iterator[str]:
    name = f"bench_{label}_{secrets.token_hex(3)}"
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield sa.make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


def with_app_name(url: str, name: str) -> str:
    return sa.make_url(url).update_query_dict({"application_name": name}).render_as_string(hide_password=False)


def wait_connected(engine: sa.Engine, procs: list[subprocess.Popen], prefix: str, timeout: float = 120) -> None:
    """Until every worker process holds a connection (named ``<prefix><i>``)."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            names = conn.execute(
                sa.text(
                    "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name LIKE :p"
                ),
                {"p": prefix + "%"},
            ).scalar()
        if names == len(procs):
            return
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(
                f"worker exited {dead[0].returncode} before the drain: {dead[0].stderr.read().decode()[-1500:]}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {names} of {len(procs)} workers connected")
        time.sleep(0.05)


def wait_done(engine: sa.Engine, sql: str, jobs: int, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            if conn.execute(sa.text(sql)).scalar() == jobs:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not drained within {timeout}s")
        time.sleep(0.1)


def stop(procs: list[subprocess.Popen], what: str, *, graceful: bool) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
    for p in procs:
        _, err = p.communicate(timeout=60)
        if graceful and p.returncode != 0:
            raise RuntimeError(f"{what} worker exited {p.returncode}: {err.decode()[-1500:]}")


def window(engine: sa.Engine, sql: str) -> float:
    with engine.connect() as conn:
        first, last = conn.execute(sa.text(sql)).one()
    return (last - first).total_seconds()


def run_tether(jobs: int, workers: int) -> float:
    sys.path.insert(0, str(REPO / "tests"))
    import pg_jobtypes
    from tether import Coordinator
    from tether.jobtypes import default_registry
    from tether.ledger.wakeup import wakeup_for

    with fresh_database("tether") as url:
        registry = default_registry()
        pg_jobtypes.register(registry)
        root = REPO / ".bench" / "pg-drain-root"
        with Coordinator.open(url, root=root, registry=registry) as c:
            c.queue.wakeup = wakeup_for(c.engine)  # what Coordinator will pick by itself
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            procs = [
                subprocess.Popen(
                    [
                        str(TETHER),
                        "--db",
                        with_app_name(url, f"bench-w{i}"),
                        "--root",
                        str(root),
                        "--import",
                        "tests.pg_jobtypes",
                        "worker",
                        "--quiet",
                        "--poll-interval",
                        "0.05",
                    ],
                    cwd=REPO,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                for i in range(workers)
            ]
            try:
                wait_connected(c.engine, procs, "bench-w")
                c.enqueue_many([pg_jobtypes.PgNoop(n=i) for i in range(jobs)])
                wait_done(c.engine, "SELECT count(*) FROM tether_jobs WHERE status = 'completed'", jobs)
            finally:
                stop(procs, "tether", graceful=True)
            return jobs / window(c.engine, "SELECT min(claimed_at), max(completed_at) FROM tether_jobs")


def run_pgqueuer(python: Path, jobs: int, workers: int) -> float:
    script = str(VENV_PGQ / "pgq_side.py")
    with fresh_database("pgq") as url:
        dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        subprocess.run([str(python), script, dsn, "install", "0"], check=True, capture_output=True)
        engine = sa.create_engine(url)
        procs = [
            subprocess.Popen(
                [str(python), script, with_app_name(dsn, f"bench-w{i}"), "work", "0"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for i in range(workers)
        ]
        try:
            wait_connected(engine, procs, "bench-w")
            subprocess.run([str(python), script, dsn, "enqueue", str(jobs)], check=True, capture_output=True)
            wait_done(engine, "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'", jobs)
            return jobs / window(
                engine,
                "SELECT min(created) FILTER (WHERE status = 'picked'), "
                "max(created) FILTER (WHERE status = 'successful') FROM pgqueuer_log",
            )
        finally:
            stop(procs, "pgqueuer", graceful=False)  # its run() has no clean stop from outside
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", default="1,4,8", help="worker process counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    python = ensure_pgqueuer_venv()
    with sa.create_engine(ADMIN_URL).connect() as conn:
        server = conn.execute(sa.text("SELECT version()")).scalar().split(" on ")[0]
        sync = conn.execute(sa.text("SHOW synchronous_commit")).scalar()
    print(
        f"{platform.node()}: {os.cpu_count()} cores, {server}, synchronous_commit={sync}; "
        f"{args.jobs} no-op jobs, {args.runs} runs",
        flush=True,
    )

    results: dict[tuple[str, int], list[float]] = {}
    t0 = time.monotonic()
    for run in range(args.runs):
        for workers in counts:
            sides = [
                ("tether", lambda workers=workers: run_tether(args.jobs, workers)),
                ("pgqueuer", lambda workers=workers: run_pgqueuer(python, args.jobs, workers)),
            ]
            for name, fn in sides if (run + workers) % 2 == 0 else reversed(sides):
                rate = fn()
                results.setdefault((name, workers), []).append(rate)
                print(f"  run {run + 1} {name:8} {workers} worker(s): {rate:7.0f} jobs/s", flush=True)

    print(f"\nmedian drain throughput, jobs/s ({time.monotonic() - t0:.0f}s in all)")
    print(f"{'workers':>7} {'tether':>8} {'pgqueuer':>9} {'tether/pgqueuer':>16}")
    for workers in counts:
        t = statistics.median(results[("tether", workers)])
        p = statistics.median(results[("pgqueuer", workers)])
        print(f"{workers:>7} {t:>8.0f} {p:>9.0f} {t / p:>16.2f}")


if __name__ == "__main__":
    main()
