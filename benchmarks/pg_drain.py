"""Drain throughput on PostgreSQL: tether with 1, 4 and 8 worker processes, next to pgqueuer and
procrastinate.

    .venv/bin/python benchmarks/pg_drain.py [--jobs 3000] [--workers 1,4,8] [--runs 3] [--only tether,pgqueuer]
        [--before SRC] [--analyzed]

Per run and worker count, each system drains the same number of no-op jobs on the same server,
each in a fresh database of its own, interleaved (the order of the systems rotates per run).
The worker processes are started first and waited for (each connects under its own
application_name); only then are all jobs enqueued in one transaction, so process start-up
(imports) never competes with the drain for the 2 cores.

- tether: N ``tether worker --quiet --poll-interval 0.05`` processes (job type ``pg_noop`` from
  tests/pg_jobtypes.py; the CLI defaults otherwise), stopped with SIGTERM once all jobs completed.
- pgqueuer: installed from PyPI into its own venv (.bench/venv-pgq, created on first use, never
  the project's venv); N processes run ``QueueManager.run()`` with a no-op entrypoint at its
  defaults (batch size 10), stopped once all jobs succeeded.
- procrastinate: likewise in .bench/venv-procrastinate; its schema applied with
  ``schema_manager.apply_schema_async()``; jobs deferred with one ``batch_defer_async``; N
  processes run ``app.run_worker_async()`` at its defaults (concurrency 1, LISTEN/NOTIFY on,
  jobs kept) with an ``async`` no-op task, stopped once all jobs succeeded.

Throughput is jobs / drain window, the window read from each system's own tables: from the first
claim to the last recorded completion (tether: min(claimed_at)..max(completed_at) of tether_jobs;
pgqueuer: first 'picked' to last 'successful' row of pgqueuer_log; procrastinate: first 'started'
to last 'succeeded' row of procrastinate_events, whose ``at`` is the writing transaction's
start). Figures are medians over runs; the ratios are tether / the other. With ``--before SRC``
(another checkout's ``src/``), that tree's tether is one more system, ``before``, run the same way
by a child process whose path puts it first. ``--analyzed`` (tether and before only): the jobs
are enqueued in a transaction of the benchmark's own (``session=``) that then runs ``ANALYZE``, so
the drain's claims plan on statistics as autovacuum leaves them on a running system, not on a new
table's none.
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
from sqlalchemy.orm import Session

REPO = Path(__file__).resolve().parent.parent
VENV_PGQ = REPO / ".bench" / "venv-pgq"
PGQUEUER = "pgqueuer==1.6.0"
VENV_PROCRASTINATE = REPO / ".bench" / "venv-procrastinate"
PROCRASTINATE = "procrastinate==3.10.0"
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


# The procrastinate side, run by its venv's python: install | enqueue N | drain.
PROCRASTINATE_SCRIPT = r"""
import asyncio, sys
import procrastinate

async def main(dsn, cmd, n):
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop():
        return None

    async with app.open_async():
        if cmd == "install":
            await app.schema_manager.apply_schema_async()
        elif cmd == "enqueue":
            await noop.batch_defer_async(*([{}] * n))
        else:
            await app.run_worker_async()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def ensure_venv(venv: Path, package: str, script: str) -> tuple[Path, Path]:
    """A benchmark's own environment with ``package`` from PyPI (created once, never the
    project's venv), and its side script written into it: (python, script)."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} with {package} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", package, "psycopg[binary]>=3.1"], check=True)
    path = venv / "side.py"
    path.write_text(script)
    return python, path


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


def run_before(src: Path, jobs: int, workers: int, analyzed: bool = False) -> float:
    """``run_tether`` with another checkout's tether (``src`` first on the path), in a child
    process: the ledger is made, filled and read by that tree's code, as its workers expect."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO)])}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(jobs), str(workers), str(src), str(int(analyzed))],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"before side failed:\n{done.stderr}")
    return float(done.stdout.split()[-1])


def run_tether(jobs: int, workers: int, src: Path | None = None, analyzed: bool = False) -> float:
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
            # This checkout's tree unless another's is named: the venv's own install may be elsewhere.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src or REPO / "src"), str(REPO)])}
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
                payloads = [pg_jobtypes.PgNoop(n=i) for i in range(jobs)]
                if analyzed:  # the jobs and their statistics commit together, as autovacuum would leave them
                    with Session(c.engine) as session:
                        c.enqueue_many(payloads, session=session)
                        session.execute(sa.text("ANALYZE tether_jobs"))
                        session.commit()
                else:
                    c.enqueue_many(payloads)
                wait_done(c.engine, "SELECT count(*) FROM tether_jobs WHERE status = 'completed'", jobs)
            finally:
                stop(procs, "tether", graceful=True)
            return jobs / window(c.engine, "SELECT min(claimed_at), max(completed_at) FROM tether_jobs")


def run_pgqueuer(side: tuple[Path, Path], jobs: int, workers: int) -> float:
    return _run_other(
        side,
        "pgq",
        jobs,
        workers,
        "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
        "SELECT min(created) FILTER (WHERE status = 'picked'), "
        "max(created) FILTER (WHERE status = 'successful') FROM pgqueuer_log",
    )


def run_procrastinate(side: tuple[Path, Path], jobs: int, workers: int) -> float:
    return _run_other(
        side,
        "procrastinate",
        jobs,
        workers,
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        "SELECT min(at) FILTER (WHERE type = 'started'), "
        "max(at) FILTER (WHERE type = 'succeeded') FROM procrastinate_events",
    )


def _run_other(side: tuple[Path, Path], label: str, jobs: int, workers: int, done_sql: str, window_sql: str) -> float:
    """Another system's drain: its side script installs its schema, N processes wait for work,
    one call enqueues ``jobs``; jobs/s over the window ``window_sql`` reads."""
    python, script = side
    with fresh_database(label) as url:
        dsn = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        subprocess.run([str(python), str(script), dsn, "install", "0"], check=True, capture_output=True)
        engine = sa.create_engine(url)
        procs = [
            subprocess.Popen(
                [str(python), str(script), with_app_name(dsn, f"bench-w{i}"), "work", "0"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for i in range(workers)
        ]
        try:
            wait_connected(engine, procs, "bench-w")
            subprocess.run([str(python), str(script), dsn, "enqueue", str(jobs)], check=True, capture_output=True)
            wait_done(engine, done_sql, jobs)
            return jobs / window(engine, window_sql)
        finally:
            stop(procs, label, graceful=False)  # measured; how they stop is not
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", default="1,4,8", help="worker process counts, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default="tether,pgqueuer,procrastinate", help="systems, comma-separated")
    parser.add_argument("--before", type=Path, help="another checkout's src: its tether is a system too ('before')")
    parser.add_argument(
        "--analyzed",
        action="store_true",
        help="tether: the planner's statistics gathered on a queue as full before the drain, as a running "
        "system has them (by default the ledger is new: none until autovacuum's first ANALYZE)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # run_before's child: PYTHONPATH puts the other tree first
        jobs, workers, src, analyzed = args.child
        print(run_tether(int(jobs), int(workers), Path(src), analyzed=analyzed == "1"))
        return
    counts = [int(w) for w in args.workers.split(",")]
    names = args.only.split(",") + (["before"] if args.before else [])
    pgq = ensure_venv(VENV_PGQ, PGQUEUER, PGQ_SCRIPT) if "pgqueuer" in names else None
    pcr = ensure_venv(VENV_PROCRASTINATE, PROCRASTINATE, PROCRASTINATE_SCRIPT) if "procrastinate" in names else None
    with sa.create_engine(ADMIN_URL).connect() as conn:
        server = conn.execute(sa.text("SELECT version()")).scalar().split(" on ")[0]
        sync = conn.execute(sa.text("SHOW synchronous_commit")).scalar()
    print(
        f"{platform.node()}: {os.cpu_count()} cores, {server}, synchronous_commit={sync}; "
        f"{args.jobs} no-op jobs, {args.runs} runs; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    results: dict[tuple[str, int], list[float]] = {}
    t0 = time.monotonic()
    for run in range(args.runs):
        for workers in counts:
            sides = {
                "tether": lambda workers=workers: run_tether(args.jobs, workers, analyzed=args.analyzed),
                "before": lambda workers=workers: run_before(args.before, args.jobs, workers, args.analyzed),
                "pgqueuer": lambda workers=workers: run_pgqueuer(pgq, args.jobs, workers),  # type: ignore[arg-type]
                "procrastinate": lambda workers=workers: run_procrastinate(pcr, args.jobs, workers),  # type: ignore[arg-type]
            }
            turn = (run + workers) % len(names)
            for name in names[turn:] + names[:turn]:
                rate = sides[name]()
                results.setdefault((name, workers), []).append(rate)
                print(
                    f"  run {run + 1} {name:13} {workers} worker(s): {rate:7.0f} jobs/s "
                    f"(load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )

    print(f"\nmedian drain throughput, jobs/s ({time.monotonic() - t0:.0f}s in all; load {os.getloadavg()[0]:.1f})")
    others = [n for n in names if n != "tether"]
    print(f"{'workers':>7}" + "".join(f" {n:>13}" for n in names) + "".join(f" {'tether/' + n:>21}" for n in others))
    for workers in counts:
        line = f"{workers:>7}" + "".join(f" {statistics.median(results[(n, workers)]):>13.0f}" for n in names)
        if "tether" in names:
            for n in others:
                ratios = [t / o for t, o in zip(results[("tether", workers)], results[(n, workers)], strict=True)]
                line += f" {statistics.median(ratios):>21.2f}"
        print(line)


if __name__ == "__main__":
    main()
