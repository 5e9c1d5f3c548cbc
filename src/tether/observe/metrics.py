"""The ledger's numbers as Prometheus metrics: one collector, served over HTTP or printed once.

``LedgerCollector`` reads the ledger on every scrape, so the numbers are the database's, not one
process's: any number of workers can run, and any process can serve them. ``registry`` puts it
beside prometheus-client's process collectors; ``serve`` answers scrapes with prometheus-client's
own HTTP server (``tether metrics --serve``), and an ASGI app mounts the same registry with
``prometheus_client.make_asgi_app(registry(source))``.

A scrape costs the same on a ledger of a thousand or a million jobs: waiting, running and failed
jobs are counted through the indexes partial to them, and finished jobs are read once each. The
collector keeps cumulative counters and histograms (Prometheus's own model: ``rate()`` over them)
and reads only the jobs that finished since its previous scrape, an index range on
``completed_at``. It reads up to ``settle`` before now, so a group commit that lands a little
after its jobs' completion times is still counted. What completed jobs paid (an AI assistant's
cost and tokens, recorded in their results) is added up in that same reading, by type and model.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from .. import events
from ..errors import ConfigError, DatabaseUnavailable
from ..ledger import faults
from ..ledger.engine import ledger_name
from ..ledger.schema import FAILED_SQL
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from ..reconcile import runs as reconcile_runs
from .health import stats
from .readonly import Source, engine_of, now_of, reading
from .tally import FinishedTally, SpendSum
from .verdict import Thresholds, assess

DEFAULT_PORT = 9464  # the port Prometheus's registry of exporter ports gives OpenTelemetry's exporters
SETTLE = timedelta(seconds=60)
"""How far behind now a served scrape reads finished jobs. A worker stamps ``completed_at`` when
the handler returns and commits outcomes in groups, a moment later; a job committed more than
this after its stamp (it waited behind a batch-mate that ran longer) is not counted."""
SAMPLE = 20_000
"""Finished jobs of each outcome a one-off reading reads at most (``exposition``)."""
_BACKLOG_AND_FAILED = (JobStatus.PENDING, JobStatus.CLAIMED, JobStatus.FAILED)


class LedgerCollector:
    """Collects, per scrape: jobs waiting, running and failed by type; outstanding, stuck, oldest
    pending age, health; jobs finished since ``since`` by outcome and type, with histograms of
    their run time, queue wait and attempts, and the cost and tokens completed jobs recorded (by
    type and model); the last reconcile verdict.

    ``since`` defaults to now (a served collector counts what finishes while it runs); ``settle``
    is how far behind now it reads finished jobs (``SETTLE``; zero for a one-off reading);
    ``sample``: read about that many finished jobs of each outcome at most, each standing for
    the jobs left unread (``FinishedTally.advance``), and say so (``tether_jobs_finished_sample_every``)."""

    def __init__(
        self,
        source: Source,
        *,
        lock_timeout: float | None = None,
        since: datetime | None = None,
        settle: timedelta = SETTLE,
        thresholds: Thresholds | None = None,
        sample: int | None = None,
    ) -> None:
        self.source = source
        self.sample = sample
        self.lock_timeout = lock_timeout
        self.settle = settle
        self.thresholds = thresholds or Thresholds()
        self.finished = FinishedTally(since or now_of(source, None))

    def describe(self) -> list[Metric]:
        # Registering must not query the database (prometheus-client calls describe or collect).
        return []

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            families = self._read()
        except (DatabaseUnavailable, sa.exc.SQLAlchemyError) as e:
            # A corrupt or vanished ledger too: its fault, not a traceback for the scraper.
            fault = (
                e if isinstance(e, DatabaseUnavailable) else faults.ledger_fault(e, ledger_name(engine_of(self.source)))
            )
            if fault is None:
                raise
            # An exporter's convention (pg_up, mysql_up): the scrape succeeds and says the source is down.
            events.emit("metrics_ledger_unavailable", reason=str(fault))
            yield _gauge("tether_ledger_up", "1 if the last scrape could read the ledger.", 0)
            return
        yield from families
        yield _gauge("tether_ledger_up", "1 if the last scrape could read the ledger.", 1)
        yield _gauge(
            "tether_ledger_scrape_duration_seconds",
            "Time this scrape spent reading the ledger.",
            time.perf_counter() - started,
        )

    def _read(self) -> list[Metric]:
        now = now_of(self.source, None)
        s = stats(self.source, lock_timeout=self.lock_timeout, now=now)
        with reading(self.source) as conn:
            failed = _failed_by_type(conn)
            with self.finished.lock:
                self.finished.advance(conn, now - self.settle, sample=self.sample)
                out = self._finished_families()
                seen = self.finished.types()
            verdict = reconcile_runs.last(conn)
        counted = {(JobStatus.FAILED.value, name): n for name, n in failed.items()}
        for b in s.by_type:
            counted[(JobStatus.PENDING.value, b.type)] = b.pending
            counted[(JobStatus.CLAIMED.value, b.type)] = b.claimed
        jobs = GaugeMetricFamily(
            "tether_jobs",
            "Jobs waiting (pending), running (claimed) or failed (waiting for an operator), by type. "
            "Completed jobs are counted in tether_jobs_finished_total.",
            labels=["status", "type"],
        )
        # Every status appears for every type seen, at zero too, so an alert on
        # tether_jobs{status="failed"} sees 0 rather than no series.
        for job_type in sorted({name for _, name in counted} | seen):
            for status in _BACKLOG_AND_FAILED:
                jobs.add_metric([status.value, job_type], counted.get((status.value, job_type), 0))
        return [
            jobs,
            _gauge("tether_jobs_outstanding", "Pending plus claimed jobs (the backlog).", s.outstanding),
            _gauge("tether_jobs_failed", "Failed jobs (waiting for an operator).", s.failed),
            _gauge("tether_jobs_stuck", "Claimed jobs whose lock is older than the lock timeout.", s.stuck),
            _gauge("tether_lock_timeout_seconds", "Lock timeout used to count stuck jobs.", s.lock_timeout),
            _gauge(
                "tether_oldest_pending_age_seconds",
                "Age of the oldest pending job (0 if none).",
                s.oldest_pending_age or 0,
            ),
            _gauge(
                "tether_backlog_soft_limit", "Backlog soft limit of the health verdict.", self.thresholds.backlog_limit
            ),
            _gauge(
                "tether_health",
                "Health verdict: 0 ok, 1 warning, 2 error.",
                assess(s, self.thresholds).verdict.exit_code,
            ),
            *out,
            *_reconcile_families(verdict),
        ]

    def _finished_families(self) -> list[Metric]:
        f = self.finished
        created = f.since.timestamp()
        done = CounterMetricFamily(
            "tether_jobs_finished",
            "Jobs that completed or failed since the collector started (tether_jobs_finished_created).",
            labels=["status", "type"],
        )
        for (status, job_type), n in sorted(f.counts.items()):
            done.add_metric([status, job_type], n, created=created)
        histograms = []
        for n, (name, doc) in enumerate(
            (
                ("tether_job_duration_seconds", "claimed_at to completed_at of completed jobs (last attempt)."),
                (
                    "tether_job_queue_wait_seconds",
                    "run_at (enqueue, or the end of a delay or backoff) to claimed_at of completed jobs.",
                ),
                ("tether_job_attempts", "Attempts a completed job took."),
            )
        ):
            family = HistogramMetricFamily(name, doc, labels=["type"])
            for job_type, hs in sorted(f.by_type.items()):
                family.add_metric([job_type], hs[n].buckets(), round(hs[n].sum, 3))
            histograms.append(family)
        sampled = []
        if f.every:
            every = GaugeMetricFamily(
                "tether_jobs_finished_sample_every",
                "1 in how many finished jobs of each outcome this reading read: the finished counts, "
                "histograms, cost and tokens are those jobs' times this (1: every job was read).",
                labels=["status"],
            )
            for status, k in sorted(f.every.items()):
                every.add_metric([status], k)
            sampled.append(every)
        return [done, *histograms, *_spend_families(f.spend, created), *sampled]


def _spend_families(spend: dict[tuple[str, str], SpendSum], created: float) -> list[Metric]:
    billed = CounterMetricFamily(
        "tether_jobs_billed",
        "Completed jobs whose result records a cost (an AI assistant was called), by type and model.",
        labels=["type", "model"],
    )
    cost = CounterMetricFamily(
        "tether_job_cost_usd",
        "US dollars completed jobs paid, as their results record it (the assistant's total_cost_usd).",
        labels=["type", "model"],
    )
    tokens = CounterMetricFamily(
        "tether_job_tokens",
        "Tokens completed jobs used, as their results record it; token_type is input or output.",
        labels=["type", "model", "token_type"],
    )
    for (job_type, model), spent in sorted(spend.items()):
        billed.add_metric([job_type, model], spent.jobs, created=created)
        cost.add_metric([job_type, model], round(spent.cost, 6), created=created)
        tokens.add_metric([job_type, model, "input"], spent.input_tokens, created=created)
        tokens.add_metric([job_type, model, "output"], spent.output_tokens, created=created)
    return [billed, cost, tokens]


def _failed_by_type(conn: sa.Connection) -> dict[str, int]:
    # ix_tether_jobs_failed alone, never a failed job's row: its condition is written as the
    # index's own literal, which both databases match when they plan; named for SQLite, which
    # without statistics prefers the range of ix_tether_jobs_done and a row per failed job.
    failed: Any = jobs_table
    if conn.dialect.name == "sqlite":
        failed = sa.text(f"{jobs_table.name} INDEXED BY ix_tether_jobs_failed")
    job_type: sa.ColumnClause[Any] = sa.literal_column("type")
    query = sa.select(job_type, sa.func.count()).select_from(failed).where(sa.text(FAILED_SQL)).group_by(job_type)
    return {name: n for name, n in conn.execute(query)}


def _reconcile_families(verdict: reconcile_runs.Verdict | None) -> list[Metric]:
    if verdict is None:  # never checked: no series, rather than a verdict nobody gave
        return []
    targets = GaugeMetricFamily(
        "tether_reconcile_last_targets", "Targets by status in the last reconcile check.", labels=["status"]
    )
    for status, n in sorted(verdict.counts.items()):
        targets.add_metric([status], n)
    return [
        _gauge(
            "tether_reconcile_last_run_timestamp_seconds",
            "When the last reconcile check finished (Unix time).",
            verdict.finished_at.timestamp(),
        ),
        _gauge(
            "tether_reconcile_last_verdict",
            "Exit status of the last reconcile check: 0 in sync, 1 could not check, 2 drift.",
            verdict.exit_code,
        ),
        _gauge("tether_reconcile_last_drift", "Paths found drifted by the last reconcile check.", verdict.drift),
        targets,
    ]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def registry(source: Source, *, process: bool = True, **kwargs: Any) -> CollectorRegistry:
    """A registry of one ``LedgerCollector(source, **kwargs)`` and, with ``process``, this process's
    own metrics (CPU, memory, file descriptors, Python's GC): what a scrape endpoint serves."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LedgerCollector(source, **kwargs))
    if process:
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
    return reg


def exposition(
    source: Source, *, window: timedelta = timedelta(hours=1), sample: int | None = SAMPLE, **kwargs: Any
) -> bytes:
    """One reading in Prometheus text format (0.0.4), the finished-job families counting the last
    ``window``: what ``tether metrics`` prints for a textfile collector. A busy window is read on
    a sample of about ``sample`` jobs per outcome (None: every job), so a reading costs what a
    served scrape does however many jobs the window holds."""
    since = now_of(source, None) - window
    reg = registry(source, process=False, since=since, settle=timedelta(0), sample=sample, **kwargs)
    return generate_latest(reg)


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host!r}: cannot resolve it ({e.strerror})") from e
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def serve(
    source: Source, host: str = "127.0.0.1", port: int = DEFAULT_PORT, *, allow_remote: bool = False, **kwargs: Any
) -> tuple[Any, threading.Thread]:
    """Answer scrapes at ``http://host:port/metrics`` from a thread (prometheus-client's server);
    returns the server (``server_port``, ``shutdown()``) and its thread. Only loopback addresses
    unless ``allow_remote``: the numbers (job types, error counts) are the operator's business."""
    if not allow_remote and not is_loopback(host):
        raise ConfigError(
            f"--host {host} is not a loopback address, so any machine that reaches it could read the "
            "ledger's numbers; pass --allow-remote to serve there (and restrict who can connect)"
        )
    reg = registry(source, **kwargs)
    try:
        return start_http_server(port, addr=host, registry=reg)
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from e


__all__ = ["DEFAULT_PORT", "SAMPLE", "SETTLE", "LedgerCollector", "exposition", "registry", "serve"]
