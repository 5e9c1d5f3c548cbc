"""What tracing costs the hot path: single enqueues and a no-op drain, with OpenTelemetry absent,
installed without an SDK (the API's no-op spans), and with the SDK recording every span.

    .venv/bin/python benchmarks/otel_overhead.py [--jobs 5000] [--singles 1000] [--rounds 5]

Each round runs every variant once, in a fresh interpreter and ledger, in an order that rotates
from round to round: ``absent`` hides the package (``sys.modules["opentelemetry"] = None``, as if
not installed), ``api`` leaves it installed with no SDK configured, ``sdk`` sets a TracerProvider
whose batch processor hands spans to an exporter that drops them (the cost of recording, not of
shipping). Prints each variant's median single-enqueue latency and drain rate, and the medians of
the per-round ratios against ``absent``. Needs the otel extra (the test extra has it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

from _common import NOOP_TYPE

VARIANTS = ("absent", "api", "sdk")

_CHILD = (
    """
import json, sys, time
variant, directory, jobs, singles = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if variant == "absent":
    sys.modules["opentelemetry"] = None
elif variant == "sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)"""
    + NOOP_TYPE
    + """
c = Coordinator.open(f"sqlite:///{directory}/ledger.db", root=f"{directory}/data")
c.register(NoopType())
c.enqueue(Noop(n=-1))  # the first commit creates the file: not timed
c.run_until_idle()
latencies = []
for i in range(singles):
    start = time.perf_counter()
    c.enqueue(Noop(n=i))
    latencies.append(time.perf_counter() - start)
c.run_until_idle()
c.enqueue_many([Noop(n=i) for i in range(jobs)])
start = time.perf_counter()
ran = c.run_until_idle()
drain = time.perf_counter() - start
assert ran == jobs, ran
latencies.sort()
print(json.dumps({"enqueue_p50_us": latencies[len(latencies) // 2] * 1e6, "drain_jobs_s": jobs / drain}))
"""
)


def run(variant: str, jobs: int, singles: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tether-otel-bench-") as directory:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, variant, directory, str(jobs), str(singles)],
            capture_output=True,
            text=True,
            check=True,
        )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--singles", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        for variant in order:
            results[variant].append(run(variant, args.jobs, args.singles))
    print(f"{args.rounds} rounds, {args.singles} single enqueues and a drain of {args.jobs} no-op jobs each")
    print(f"{'variant':8} {'enqueue p50 (us)':>17} {'x absent':>9} {'drain (jobs/s)':>15} {'x absent':>9}")
    for variant in VARIANTS:
        enq = statistics.median(x["enqueue_p50_us"] for x in results[variant])
        drain = statistics.median(x["drain_jobs_s"] for x in results[variant])
        enq_ratio = statistics.median(
            x["enqueue_p50_us"] / b["enqueue_p50_us"] for x, b in zip(results[variant], results["absent"], strict=True)
        )
        drain_ratio = statistics.median(
            x["drain_jobs_s"] / b["drain_jobs_s"] for x, b in zip(results[variant], results["absent"], strict=True)
        )
        print(f"{variant:8} {enq:17.1f} {enq_ratio:9.2f} {drain:15.0f} {drain_ratio:9.2f}")


if __name__ == "__main__":
    main()
