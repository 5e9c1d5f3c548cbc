"""The ledger's numbers as Prometheus metrics (text exposition via prometheus-client).

A custom collector reads the ledger on every scrape, so the numbers are the database's, not
one process's counters: any number of workers can run, and any process can serve the metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

from . import observe
from .health import Thresholds, assess
from .observe import Source
from .status import JobStatus


class LedgerCollector:
    """Collects, per scrape: jobs by status and type, oldest pending age, failed, stuck, health,
    and a summary of completion durations over ``window``."""

    def __init__(
        self,
        source: Source,
        *,
        lock_timeout: float | None = None,
        window: timedelta = timedelta(hours=1),
        thresholds: Thresholds | None = None,
    ) -> None:
        self.source = source
        self.lock_timeout = lock_timeout
        self.window = window
        self.thresholds = thresholds or Thresholds()

    def describe(self) -> list[Metric]:
        # Registering must not query the database (prometheus-client calls describe or collect).
        return []

    def collect(self) -> Iterator[Metric]:
        s = observe.stats(self.source, lock_timeout=self.lock_timeout)
        jobs = GaugeMetricFamily("tether_jobs", "Jobs in the ledger by status and type.", labels=["status", "type"])
        counted = observe.counts(self.source)
        # Every status appears for every type seen, at zero too, so an alert on
        # tether_jobs{status="failed"} sees 0 rather than no series.
        for job_type in sorted({name for _, name in counted}):
            for status in JobStatus:
                jobs.add_metric([status.value, job_type], counted.get((status.value, job_type), 0))
        yield jobs
        yield _gauge("tether_jobs_outstanding", "Pending plus claimed jobs (the backlog).", s.outstanding)
        yield _gauge("tether_jobs_failed", "Failed jobs (waiting for an operator).", s.failed)
        yield _gauge("tether_jobs_stuck", "Claimed jobs whose lock is older than the lock timeout.", s.stuck)
        yield _gauge("tether_lock_timeout_seconds", "Lock timeout used to count stuck jobs.", s.lock_timeout)
        yield _gauge(
            "tether_oldest_pending_age_seconds",
            "Age of the oldest pending job (0 if none).",
            s.oldest_pending_age or 0.0,
        )
        yield _gauge(
            "tether_backlog_soft_limit", "Backlog soft limit of the health verdict.", self.thresholds.backlog_limit
        )
        yield _gauge(
            "tether_health", "Health verdict: 0 ok, 1 warning, 2 error.", assess(s, self.thresholds).verdict.exit_code
        )
        summary = SummaryMetricFamily(
            "tether_job_duration_seconds",
            f"claimed_at to completed_at of jobs completed in the last {self.window.total_seconds():g}s.",
            labels=["type"],
        )
        durations = observe.durations(self.source, since=self.window, now=s.now)
        for d in durations:
            summary.add_metric([d.type], count_value=d.count, sum_value=d.mean * d.count)
            for q, value in (("0.5", d.p50), ("0.95", d.p95), ("0.99", d.p99)):
                summary.add_sample("tether_job_duration_seconds", {"type": d.type, "quantile": q}, value)
        yield summary
        cost = GaugeMetricFamily(
            "tether_spend_usd",
            f"Cost (USD) of jobs completed in the last {self.window.total_seconds():g}s (AI extractions).",
            labels=["type"],
        )
        tokens = GaugeMetricFamily(
            "tether_spend_tokens",
            f"Tokens of jobs completed in the last {self.window.total_seconds():g}s (AI extractions).",
            labels=["type", "direction"],
        )
        for d in durations:
            if d.spend is not None:
                cost.add_metric([d.type], d.spend.cost_usd)
                tokens.add_metric([d.type, "input"], d.spend.input_tokens)
                tokens.add_metric([d.type, "output"], d.spend.output_tokens)
        yield cost
        yield tokens


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def exposition(source: Source, **kwargs: Any) -> bytes:
    """Prometheus text exposition (format 0.0.4) of the ledger, from a private registry."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(source, **kwargs))
    return generate_latest(registry)
