"""AWS drift check (issue 16): reconcile of N sync_aws resources against a local moto server,
pooled (a pool of 8 threads, the default) against one at a time, in one run.

    .venv/bin/python benchmarks/aws_reconcile.py [--resources 1000] [--runs 3] [--pool 8] [--rtt-ms 0]

A moto server is started as its own process on a free loopback port (never a real AWS endpoint;
dummy credentials), so the server's work does not share this process's GIL with the probes. The
resources (SQS queues and SSM parameters, half each) are created by real sync_aws jobs through a
worker, so the ledger holds what an application's would. Then ``reconcile`` runs with
``TETHER_AWS_CONCURRENCY`` = 1 and = ``--pool``, interleaved, ``--runs`` times each; every figure
is a median. Each resource is a few HTTP round trips (existence, tags, attributes), so one at a
time is bounded by latency, and the pool overlaps them.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tether import Coordinator
from tether.jobtypes.aws import SyncAws, on_client, reset_clients
from tether.reconcile.check import reconcile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resources", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument(
        "--rtt-ms", type=float, default=0.0, help="add this round-trip time to every AWS call of the check (emulated)"
    )
    args = parser.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        host, port = s.getsockname()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for(host, port)
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        os.environ.pop(name, None)
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    reset_clients()
    try:
        with tempfile.TemporaryDirectory(prefix="tether-aws-bench-") as tmp:
            return _run(Path(tmp), args)
    finally:
        server.terminate()
        server.wait(30)


def _wait_for(host: str, port: int, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _run(tmp: Path, args: argparse.Namespace) -> int:
    with Coordinator.open(f"sqlite:///{tmp / 'tether.db'}", root=tmp / "data", durability="normal") as c:
        payloads = []
        for n in range(args.resources):
            if n % 2:
                payloads.append(
                    SyncAws(resource_type="sqs_queue", resource_id=f"bench-q-{n}", config={"tags": {"n": str(n)}})
                )
            else:
                payloads.append(
                    SyncAws(resource_type="ssm_parameter", resource_id=f"/bench/p-{n}", config={"value": str(n)})
                )
        start = time.perf_counter()
        c.enqueue_many(payloads)
        c.run_until_idle(threads=8)
        failed = c.stats().failed
        if failed:
            print(f"setup: {failed} sync jobs failed", file=sys.stderr)
            return 1
        print(f"setup: {args.resources} resources synced in {time.perf_counter() - start:.1f} s")

        if args.rtt_ms:
            # Loopback answers in microseconds; AWS from a region's own network in ~10-30 ms. Each
            # call of the check waits this long before it is sent (the setup above did not).
            delay = args.rtt_ms / 1000

            def slow(client: Any) -> None:
                client.meta.events.register("before-send", lambda **_: time.sleep(delay))

            reset_clients()
            on_client(slow)
        reconcile(c)  # warm: clients, connection pools, the account id (asked once)
        figures: dict[int, list[float]] = {1: [], args.pool: []}
        for _ in range(args.runs):
            for pool in (1, args.pool):
                os.environ["TETHER_AWS_CONCURRENCY"] = str(pool)
                start = time.perf_counter()
                report = reconcile(c)
                elapsed = time.perf_counter() - start
                if report.exit_code != 0 or report.counts["in_sync"] != args.resources:
                    print(f"pool {pool}: not all in sync: {report.summary()}", file=sys.stderr)
                    return 1
                figures[pool].append(elapsed)
        one, pooled = statistics.median(figures[1]), statistics.median(figures[args.pool])
        rtt = f", {args.rtt_ms:g} ms emulated round trip" if args.rtt_ms else ""
        print(f"reconcile of {args.resources} AWS resources (moto server on loopback{rtt}), median of {args.runs}:")
        print(f"  one at a time : {one:7.2f} s  ({args.resources / one:6.0f} resources/s)")
        print(f"  pool of {args.pool:<6}: {pooled:7.2f} s  ({args.resources / pooled:6.0f} resources/s)")
        print(f"  pooled is {one / pooled:.1f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
