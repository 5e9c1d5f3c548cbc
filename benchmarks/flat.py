"""Does an operation cost the same on a ledger of 100,000 jobs as on one of 10,000,000?

Times, on ledgers built by ``big_ledger.py`` (the same recent history, only longer), each
operation an application or an operator runs often, in fresh processes, the ledgers alternating
round by round (small big, big small, ...); each figure is the median over the rounds of a median
of ``--repeat`` runs after one warm-up run (the page cache warm, as on a ledger in service):

- claim: a worker's claim of a batch of 10 ready jobs (put back afterwards, untimed);
- enqueue: one durable ``create_file`` enqueue on one of the ledger's targets (removed afterwards);
- ``tether status`` (``health()`` in process, and the command end to end);
- a ``tether metrics --serve`` scrape over HTTP, steady state;
- the one-off ``tether metrics`` (in process, and the command);
- ``tether durations`` (24 h; in process, and the command), and ``--exact`` in process;
- the web ui's overview page (Starlette's test client);
- ``reconcile``, existence and content, per target (wall and process CPU time: one warm-up run,
  then the median of ``--reconcile-repeat``), and the peak RSS of the process that ran it.

    nice -n 10 .venv/bin/python benchmarks/flat.py /work/big/ledger-100k.db:/work/big/data-100k \\
        /work/big/ledger-10m.db:/work/big/data-10m --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

REPO = Path(__file__).resolve().parent.parent
CLI = {
    "tether status (CLI)": ["status"],
    "tether metrics (CLI)": ["metrics"],
    "tether durations (CLI)": ["durations"],
}


def _notify_type() -> Any:
    from tether import JobContext, JobType, Payload

    class Notify(Payload):
        job_type: ClassVar[str] = "notify"
        to: str
        subject: str

    class NotifyType(JobType[Notify]):
        name = "notify"
        payload_model = Notify

        def run(self, payload: Notify, ctx: JobContext) -> None:
            return None

    return NotifyType()


def ops(db: str, root: str, repeat: int) -> dict[str, float]:
    """Every operation but reconcile, timed on one ledger."""
    from starlette.testclient import TestClient

    from _common import median_ms
    from big_ledger import target_payload
    from tether import Coordinator, CreateFile, ui
    from tether.jobtypes import default_registry
    from tether.observe import durations, health, metrics, readonly

    registry = default_registry()
    registry.register(_notify_type())
    c = Coordinator.open(f"sqlite:///{db}", root=root, registry=registry)
    raw = sqlite3.connect(db, isolation_level=None)
    targets = raw.execute("SELECT count(DISTINCT ordering_key) FROM (SELECT ordering_key FROM tether_jobs "
                          "WHERE ordering_key IS NOT NULL ORDER BY id DESC LIMIT 20000)").fetchone()[0]  # fmt: skip
    out: dict[str, float] = {}
    claimed: list[str] = []

    def claim() -> None:
        claimed.extend(j.id for j in c.queue.claim("bench:flat", limit=10))

    def put_back() -> None:
        marks = ",".join("?" * len(claimed))
        raw.execute(
            "UPDATE tether_jobs SET status = 'pending', attempts = 0, locked_by = NULL, locked_at = NULL, "
            f"claimed_at = NULL WHERE id IN ({marks})",
            claimed,
        )
        claimed.clear()

    out["claim 10"] = median_ms(claim, repeat, put_back)
    enqueued: list[str] = []
    turn = [0]

    def enqueue() -> None:
        t = turn[0] = (turn[0] + 7919) % max(1, targets)
        payload = json.loads(target_payload(t)[0])
        enqueued.append(c.enqueue(CreateFile(**payload, overwrite=True)).job.id)

    def remove() -> None:
        raw.execute(f"DELETE FROM tether_jobs WHERE id IN ({','.join('?' * len(enqueued))})", enqueued)
        enqueued.clear()

    out["enqueue (durable, on a target)"] = median_ms(enqueue, repeat, remove)
    engine = readonly.open_ledger(f"sqlite:///{db}")
    out["status: health()"] = median_ms(lambda: health.health(engine), repeat)
    server, _ = metrics.serve(engine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.server_port}/metrics"

    def scrape() -> None:
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()

    out["metrics --serve: a scrape"] = median_ms(scrape, repeat)
    server.shutdown()
    server.server_close()
    out["metrics, printed once"] = median_ms(lambda: metrics.exposition(engine), repeat)
    if hasattr(metrics, "SAMPLE"):  # a tree that samples: every job too (--exact)
        out["metrics, printed once, --exact"] = median_ms(lambda: metrics.exposition(engine, sample=None), repeat)
    if hasattr(durations, "SAMPLE"):  # a tree that samples: as the command does, and every job (--exact)
        sampled = lambda: durations.duration_sample(engine, with_spend=True)  # noqa: E731
        out["durations 24h"] = median_ms(sampled, repeat)
        out["durations 24h, --exact"] = median_ms(lambda: durations.durations(engine), repeat)
    else:
        out["durations 24h"] = median_ms(lambda: durations.durations(engine), repeat)
    web = TestClient(ui.app(c), base_url="http://127.0.0.1:8787")
    out["ui overview"] = median_ms(lambda: web.get("/"), repeat)
    engine.dispose()
    raw.close()
    c.close()
    return out


def check(db: str, root: str, repeat: int, content: bool) -> dict[str, float]:
    """One reconcile mode, in its own process: per target time, and peak RSS over the baseline."""
    from tether import Coordinator
    from tether.reconcile.check import reconcile

    c = Coordinator.open(f"sqlite:///{db}", root=root)
    base = _rss_kib()
    report = reconcile(c, content=content)
    targets = sum(report.counts.values())
    assert report.counts["in_sync"] == targets, report.summary()
    walls, cpus = [], []
    for _ in range(repeat):  # process CPU time too: on a machine shared with other work, wall time is its load
        started, cpu = time.perf_counter(), time.process_time()
        reconcile(c, content=content)
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    ms, cpu_ms = statistics.median(walls) * 1000, statistics.median(cpus) * 1000
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c.close()
    return {"targets": targets, "ms": ms, "us per target": ms * 1000 / targets,
            "CPU us per target": cpu_ms * 1000 / targets, "peak MiB": peak / 1024,
            "peak over baseline MiB": (peak - base) / 1024}  # fmt: skip


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


SRC: str | None = None  # --src: the tree whose ``tether`` the children import (default: this one's)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **({"PYTHONPATH": SRC} if SRC else {}), **extra}


def child(args: list[str]) -> Any:
    done = subprocess.run([sys.executable, __file__, *args], env=_env(), check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def cli_ms(db: str, argv: list[str], repeat: int) -> float:
    from _common import median_ms  # here, as in ops: the reconcile child's peak RSS stays without it

    env = _env(TETHER_DB=f"sqlite:///{db}")
    command = [sys.executable, "-m", "tether", *argv]
    return median_ms(lambda: subprocess.run(command, env=env, check=False, capture_output=True), repeat)


def jobs_in(db: str) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT max(rowid) FROM tether_jobs").fetchone()[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ledgers", nargs="*", help="DB:ROOT of each ledger (big_ledger.py), smallest first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--reconcile-repeat", type=int, default=3)
    ap.add_argument("--only", default="ops,cli,exists,content", help="what to time")
    ap.add_argument(
        "--src", help="a source tree (its src/ directory) to time instead of this one, e.g. git archive of main"
    )
    ap.add_argument("--child", choices=["ops", "exists", "content"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        db, root = args.ledgers[0].split(":")
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        if args.child == "ops":
            print(json.dumps(ops(db, root, args.repeat)))
        else:
            print(json.dumps(check(db, root, args.reconcile_repeat, args.child == "content")))
        return
    only = args.only.split(",")
    global SRC
    SRC = args.src
    sizes = [jobs_in(spec.split(":")[0]) for spec in args.ledgers]
    print(
        f"flat ({args.src or 'this tree'}): {' and '.join(f'{n:,}' for n in sizes)} jobs; "
        f"{args.rounds} alternating rounds, medians of {args.repeat} (reconcile {args.reconcile_repeat}); "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        flush=True,
    )
    results: list[dict[str, list[float]]] = [{} for _ in args.ledgers]
    for r in range(args.rounds):
        order = list(range(len(args.ledgers)))
        for n in order if r % 2 == 0 else order[::-1]:
            spec, got = args.ledgers[n], results[n]
            db = spec.split(":")[0]
            if "ops" in only:
                for name, ms in child([spec, "--child", "ops", "--repeat", str(args.repeat)]).items():
                    got.setdefault(name, []).append(ms)
            if "cli" in only:
                for name, argv in CLI.items():
                    got.setdefault(name, []).append(cli_ms(db, argv, max(3, args.repeat // 2)))
            for mode in ("exists", "content"):
                if mode in only:
                    out = child([spec, "--child", mode, "--reconcile-repeat", str(args.reconcile_repeat)])
                    for name in ("us per target", "CPU us per target", "peak MiB", "peak over baseline MiB"):
                        got.setdefault(f"reconcile {mode}: {name}", []).append(out[name])
                    got.setdefault(f"reconcile {mode}: targets", []).append(out["targets"])
        print(f"  round {r + 1} done; load average {os.getloadavg()[0]:.1f}", flush=True)
    medians = [{k: statistics.median(v) for k, v in got.items()} for got in results]
    first, last = medians[0], medians[-1]
    print(f"\n{'operation':<44}" + "".join(f"{f'{n:,} jobs':>18}" for n in sizes) + f"{'ratio':>8}")
    for name in first:
        unit = "" if "MiB" in name or "targets" in name or "us per" in name else " ms"
        cells = "".join(f"{m[name]:>15.1f}{unit:<3}" for m in medians)
        print(f"{name:<44}{cells}{last[name] / first[name]:>7.2f}x")
    print("\n" + json.dumps({"sizes": sizes, "medians": medians, "runs": results}))


if __name__ == "__main__":
    main()
