"""Issue 26: one Prometheus scrape of a large ledger, before and after, on SQLite and PostgreSQL.

For each backend and size it builds a ledger (``metrics_ledger``: N completed jobs, 2,000 pending,
20 claimed of which 4 stuck, N/1000 failed; completions spread over ``--spread`` back from now,
default one hour: a ledger just drained, where every completion is inside a one-hour window),
then times, in child processes on the same ledger, one after the other:

- before: today's ``tether metrics`` path (``metrics.exposition``) from the source at ``--before``
  (extracted with ``git archive``), and its ``durations.durations`` (24 h) and ``finished.recent`` (1 h);
- after: a scrape of ``tether metrics --serve`` by a real HTTP client (steady state: what finished
  since the previous scrape is read, here nothing), a scrape that has to read the completions of
  one 15 s scrape interval at the ledger's own completion rate, the one-off ``tether metrics``
  (window 1 h), and ``durations`` / ``recent`` as above;
- the CLI commands end to end (process start included), before and after.

Before and after alternate in --rounds rounds (B A, A B, B A): each figure is the median over the
rounds of a median of --repeat runs after one warm-up run (the page cache warm, as for a scraper),
or of one CLI run per round.

    .venv/bin/python benchmarks/scrape.py                         # 100,000 and 1,000,000, both backends
    .venv/bin/python benchmarks/scrape.py --jobs 100000 --backends sqlite --spread 30d
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from datetime import timedelta
from io import BytesIO
from pathlib import Path
from typing import Any

from _common import median_ms

REPO = Path(__file__).resolve().parent.parent
SCRATCH = REPO / ".bench"
BEFORE = "88e893d"  # main before issue 26
PG_ADMIN_URL = os.environ.get("TETHER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
INTERVAL = 15.0  # seconds between scrapes, for the "new completions" case
CLI = {
    "tether metrics (CLI)": ["metrics"],
    "tether durations (CLI)": ["durations"],
    "tether recent --since 1h (CLI)": ["recent", "--since", "1h"],
}


def child(side: str, db: str, repeat: int, rate: float) -> dict[str, float]:
    """Runs in a process whose PYTHONPATH puts one side's ``tether`` first."""
    from tether.clock import SystemClock
    from tether.observe import durations, finished, metrics, readonly

    engine = readonly.open_ledger(db)
    out: dict[str, float] = {}
    slow = max(3, repeat // 2)
    if side == "before":
        out["tether metrics (in process)"] = median_ms(lambda: metrics.exposition(engine), slow)
    else:
        server, _ = metrics.serve(engine, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.server_port}/metrics"

        def get() -> None:
            with urllib.request.urlopen(url, timeout=60) as r:
                r.read()

        out["scrape over HTTP, steady state"] = median_ms(get, repeat)
        server.shutdown()
        server.server_close()
        now = SystemClock().now()

        def catch_up() -> None:
            # A collector whose previous scrape was one interval ago: reads that interval's completions.
            since = now - metrics.SETTLE - timedelta(seconds=INTERVAL)
            list(metrics.LedgerCollector(engine, since=since).collect())

        out[f"scrape reading {INTERVAL:g} s of completions (~{rate * INTERVAL:,.0f} jobs)"] = median_ms(
            catch_up, repeat
        )
        out["tether metrics, printed once (window 1h)"] = median_ms(lambda: metrics.exposition(engine), slow)
        if hasattr(metrics, "SAMPLE"):
            out["tether metrics --exact, printed once"] = median_ms(
                lambda: metrics.exposition(engine, sample=None), slow
            )
    if hasattr(durations, "SAMPLE"):  # a tree whose command samples a busy window: what it runs
        out["durations --since 24h (in process)"] = median_ms(
            lambda: durations.duration_sample(engine, with_spend=True), slow
        )
        out["durations --since 24h --exact (in process)"] = median_ms(lambda: durations.durations(engine), slow)
    else:
        out["durations --since 24h (in process)"] = median_ms(lambda: durations.durations(engine), slow)
    out["recent --since 1h (in process)"] = median_ms(lambda: finished.recent(engine), slow)
    engine.dispose()
    return out


def extract(ref: str) -> Path:
    """The ``src`` tree of ``ref``, for the before side."""
    where = SCRATCH / f"before-{ref}"
    if not (where / "src" / "tether").is_dir():
        data = subprocess.run(["git", "-C", str(REPO), "archive", ref, "src"], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=BytesIO(data)) as tar:
            tar.extractall(where, filter="data")
    return where / "src"


def run_side(side: str, src: Path, db: str, repeat: int, rate: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = [sys.executable, __file__, "--child", side, "--db", db, "--repeat", str(repeat), "--rate", str(rate)]
    done = subprocess.run(args, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def cli_ms(src: Path, db: str, args: list[str], repeat: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src), "TETHER_DB": db}
    command = [sys.executable, "-m", "tether", *args]

    def once() -> None:
        subprocess.run(command, env=env, check=False, capture_output=True)

    return median_ms(once, repeat)


def build(backend: str, jobs: int, spread: timedelta, workdir: Path) -> tuple[str, Any]:
    from metrics_ledger import load_postgres, load_sqlite
    from tether.clock import SystemClock

    completed = jobs - 2_000 - 20 - max(10, jobs // 1000)
    now = SystemClock().now()
    if backend == "sqlite":
        path = workdir / f"ledger-{jobs}.db"
        load_sqlite(str(path), completed, now, spread)
        return f"sqlite:///{path}", None
    import sqlalchemy as sa

    name = f"tether_bench_scrape_{secrets.token_hex(4)}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    url = sa.make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    load_postgres(url, completed, now, spread)

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()

    return url, drop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="100000,1000000", help="ledger sizes, comma-separated")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--spread", default="1h", help="how far back completions go: 1h (just drained) or e.g. 30d")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3, help="alternating before/after rounds (medians over them)")
    ap.add_argument("--before", default=BEFORE, help="git ref of the before side")
    ap.add_argument("--child", choices=["before", "after"], help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.db, args.repeat, args.rate)))
        return
    sys.path.insert(0, str(REPO / "src"))
    spread = timedelta(hours=1) if args.spread == "1h" else timedelta(days=float(args.spread.rstrip("d")))
    before_src, after_src = extract(args.before), REPO / "src"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(
        f"scrape benchmark: before {args.before}, after {head.stdout.strip()} (+ working tree); "
        f"completions spread over {args.spread}; {args.rounds} alternating rounds, each a median of {args.repeat} "
        f"(slow cases {max(3, args.repeat // 2)}) or one CLI run; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        flush=True,
    )
    SCRATCH.mkdir(exist_ok=True)
    summary = []
    for backend in args.backends.split(","):
        for jobs in (int(n) for n in args.jobs.split(",")):
            workdir = Path(tempfile.mkdtemp(prefix="scrape-", dir=SCRATCH))
            start = time.perf_counter()
            db, drop = build(backend, jobs, spread, workdir)
            rate = jobs / spread.total_seconds()
            print(f"\n== {backend}, {jobs:,} jobs (built in {time.perf_counter() - start:.0f} s)", flush=True)
            try:
                # Before and after alternate, round by round (B A, A B, ...): on a shared machine
                # load comes and goes, and must hit both sides alike.
                rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
                cli_runs: dict[str, dict[str, list[float]]] = {}
                for r in range(args.rounds):
                    for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                        src = before_src if side == "before" else after_src
                        rounds[side].append(run_side(side, src, db, args.repeat, rate))
                        for label, argv in CLI.items():
                            cli_runs.setdefault(label, {}).setdefault(side, []).append(cli_ms(src, db, argv, 1))
                before = {k: statistics.median(x[k] for x in rounds["before"]) for k in rounds["before"][0]}
                after = {k: statistics.median(x[k] for x in rounds["after"]) for k in rounds["after"][0]}
                cli = {k: (statistics.median(v["before"]), statistics.median(v["after"])) for k, v in cli_runs.items()}
            finally:
                if drop:
                    drop()
                shutil.rmtree(workdir, ignore_errors=True)
            for name, ms in before.items():
                print(f"  before  {name:<58} {ms:9.1f} ms")
            for name, ms in after.items():
                print(f"  after   {name:<58} {ms:9.1f} ms")
            for name, (b, a) in cli.items():
                print(f"  CLI     {name:<40} before {b:8.0f} ms   after {a:8.0f} ms   {b / a:5.1f}x")
            scrape_before = before["tether metrics (in process)"]
            scrape_after = after["scrape over HTTP, steady state"]
            ratio = scrape_before / scrape_after
            print(f"  scrape: before {scrape_before:.1f} ms, after {scrape_after:.1f} ms ({ratio:.0f}x)")
            summary.append({"backend": backend, "jobs": jobs, "before": before, "after": after, "cli": cli})
    print("\n" + json.dumps(summary))


if __name__ == "__main__":
    main()
