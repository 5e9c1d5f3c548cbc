"""How fast each page of ``tether ui`` renders on a 1,000,000-job SQLite ledger (target: 200 ms).

Builds the ledger of ``benchmarks/status.py`` (its mix: ~97% completed over 30 days, a 2%
backlog, 1% failed, claimed and stuck jobs, re-used keys), serves ``tether.ui.app`` in process
(Starlette's test client: the full ASGI path, middleware and template included, no socket) and
times each page: the median of --repeat requests after one warm-up, next to the observe call
the page is built on, measured in the same run. Pages over the budget are flagged.

    .venv/bin/python benchmarks/ui_pages.py                  # 1,000,000 jobs
    .venv/bin/python benchmarks/ui_pages.py --keep           # keep the ledger (path printed)
    .venv/bin/python benchmarks/ui_pages.py --ledger .bench/status-xxxx/tether.db
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from starlette.testclient import TestClient

from _common import machine, median_ms
from status import SCRATCH, build
from tether import Coordinator, SystemClock, ui
from tether.ledger import workers
from tether.observe import durations, finished
from tether.observe.health import health
from tether.ui.web import DURATIONS_SAMPLE

BUDGET_MS = 200.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the ledger (path printed)")
    ap.add_argument("--ledger", type=Path, help="time this existing ledger instead of building one")
    args = ap.parse_args()
    SCRATCH.mkdir(exist_ok=True)
    if args.ledger:
        path = args.ledger.resolve()
        args.keep = True
    else:
        path = Path(tempfile.mkdtemp(prefix="ui-", dir=SCRATCH)) / "tether.db"
        start = time.perf_counter()
        build(path, args.jobs, SystemClock().now())
        print(f"built {args.jobs:,} jobs in {time.perf_counter() - start:.1f}s at {path}", flush=True)
    with sqlite3.connect(path) as c:
        counts = dict(c.execute("SELECT status, count(*) FROM tether_jobs GROUP BY status").fetchall())
        one_failed = c.execute("SELECT id FROM tether_jobs WHERE status = 'failed' LIMIT 1").fetchone()[0]
        target = c.execute("SELECT ordering_key FROM tether_jobs WHERE ordering_key IS NOT NULL LIMIT 1").fetchone()[0]
        key = c.execute("SELECT idempotency_key FROM tether_jobs WHERE idempotency_key IS NOT NULL LIMIT 1").fetchone()[
            0
        ]
        holders = [w for (w,) in c.execute("SELECT DISTINCT locked_by FROM tether_jobs WHERE status = 'claimed'")]
    print(f"ledger: {sum(counts.values()):,} jobs {counts}; {len(holders)} workers; {machine()}")

    coordinator = Coordinator.open(f"sqlite:///{path}", root=path.parent / "data")
    # The workers that hold the ledger's claimed jobs, registered as running workers register.
    for holder in holders:
        workers.register(coordinator.queue, holder, 4)
    web = TestClient(ui.app(coordinator), base_url="http://127.0.0.1:8787")
    second = web.get("/jobs", params={"status": "completed"}).text
    after = second.split("after=", 1)[1].split('"', 1)[0].replace("&amp;", "&") if "after=" in second else ""
    pages = {
        "overview": "/",
        "overview (live part)": "/live/overview",
        "jobs (all, newest)": "/jobs",
        "jobs, page 2 of completed": f"/jobs?status=completed&after={after}",
        "jobs, failed": "/jobs?status=failed",
        "jobs, pending": "/jobs?status=pending",
        "jobs, ready (an overview counter's link)": "/jobs?status=ready",
        "jobs, scheduled": "/jobs?status=scheduled",
        "jobs, retrying": "/jobs?status=retrying",
        "jobs, running": "/jobs?status=running",
        "jobs, stuck": "/jobs?status=stuck",
        "jobs, claimed, oldest first": "/jobs?status=claimed&order=oldest",
        "jobs, type notify": "/jobs?type=notify",
        "jobs, failed of a type": "/jobs?status=failed&type=sync_aws",
        f"jobs, target {target}": f"/jobs?target={target}",
        "jobs, key": f"/jobs?type=claude_extraction&key={key}",
        "jobs, enqueued within 1h": "/jobs?window=1h",
        "one job": f"/jobs/{one_failed}",
        "failed (by error)": "/failed",
        "durations (1h, the page's default)": "/durations",
        "durations (24h)": "/durations?window=24h",
        "drift (no check run)": "/drift",
        "workers": "/workers",
        "workers (live part)": "/live/workers",
        "aws resources (first page)": "/aws",
        "aws resources (a page deep in)": "/aws?after=aws:s3_bucket:eu-west-1:bucket-5",
        "extractions (1h, the page's default)": "/extractions",
        "extractions (24h)": "/extractions?window=24h",
    }
    under = {
        "overview": lambda: health(coordinator),  # stats + the alert window's activity, as tether status
        "failed (by error)": lambda: finished.failed_by_error(coordinator),
        "durations (1h, the page's default)": lambda: durations.duration_sample(
            coordinator, since=timedelta(hours=1), limit=DURATIONS_SAMPLE
        ),
        "durations (24h)": lambda: durations.duration_sample(
            coordinator, since=timedelta(hours=24), limit=DURATIONS_SAMPLE
        ),
    }
    print(f"\n{'page':<44}{'status':>7}{'median ms':>11}{'observe ms':>12}  budget {BUDGET_MS:.0f} ms")
    over = []
    for name, url in pages.items():
        status = web.get(url).status_code
        ms = median_ms(lambda url=url: web.get(url), args.repeat)
        base = f"{median_ms(under[name], args.repeat):>12.1f}" if name in under else f"{'':>12}"
        flag = "" if ms < BUDGET_MS and status == 200 else "  OVER" if status == 200 else f"  HTTP {status}"
        if flag:
            over.append(name)
        print(f"{name[:43]:<44}{status:>7}{ms:>11.1f}{base}{flag}")
    exact_ms = median_ms(lambda: durations.durations(coordinator, since=timedelta(hours=24)), 3)
    print(f"{'(exact durations.durations 24h: tether durations)':<44}{'':>7}{'':>11}{exact_ms:>12.1f}")
    metrics_ms = median_ms(lambda: web.get("/metrics"), 3)
    print(f"{'(/metrics: a scrape of the served collector)':<44}{'':>7}{metrics_ms:>11.1f}")
    print(
        f"\n{len(pages) - len(over)} of {len(pages)} pages under {BUDGET_MS:.0f} ms"
        + (f"; over: {over}" if over else "")
    )
    coordinator.close()
    if not args.keep:
        shutil.rmtree(path.parent, ignore_errors=True)
    else:
        print(f"ledger kept at {path}")


if __name__ == "__main__":
    main()
