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
from bisect import bisect_left
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import orjson
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
from sqlalchemy.dialects.postgresql import ARRAY, array

from .. import events
from ..errors import ConfigError, DatabaseUnavailable
from ..ledger import faults
from ..ledger.engine import ledger_name
from ..ledger.status import JobStatus
from ..reconcile import runs as reconcile_runs
from . import billing
from . import queries as observe
from .health import Thresholds, assess
from .readonly import Source, engine_of, finished, now_of, reading, t

DEFAULT_PORT = 9464  # the port Prometheus's registry of exporter ports gives OpenTelemetry's exporters
SETTLE = timedelta(seconds=60)
"""How far behind now a served scrape reads finished jobs. A worker stamps ``completed_at`` when
the handler returns and commits outcomes in groups, a moment later; a job committed more than
this after its stamp (it waited behind a batch-mate that ran longer) is not counted."""
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
ATTEMPT_BUCKETS = (1, 2, 3, 5, 10)
# Each bound plus half a resolution step (1 ms, 1 attempt): the count of these below a value is
# the bucket of a value measured to that resolution, a value on a bound included in it (le).
_SECONDS_ABOVE = tuple(b + 0.0005 for b in SECONDS_BUCKETS)
_ATTEMPTS_ABOVE = tuple(b + 0.5 for b in ATTEMPT_BUCKETS)
_BACKLOG_AND_FAILED = (JobStatus.PENDING, JobStatus.CLAIMED, JobStatus.FAILED)
UNKNOWN_MODEL = "unknown"
"""The model label of a cost whose result names no model."""


class _Histogram:
    """Buckets of one label set, as Prometheus's client keeps them (exposed cumulatively)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, the last one +Inf
        self.sum = 0.0

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class _Spend:
    """What the completed jobs of one (type, model) paid, as their results record it."""

    __slots__ = ("cost", "input_tokens", "jobs", "output_tokens")

    def __init__(self) -> None:
        self.jobs = 0
        self.cost = 0.0
        self.input_tokens = 0
        self.output_tokens = 0

    def add(self, jobs: int, cost: float | None, input_tokens: float | None, output_tokens: float | None) -> None:
        self.jobs += jobs
        self.cost += float(cost or 0)
        self.input_tokens += int(input_tokens or 0)
        self.output_tokens += int(output_tokens or 0)


class _Finished:
    """Jobs that finished after ``since``, accumulated as they are read: counts by outcome and
    type; run time, queue wait and attempts of completed jobs by type; and what completed jobs
    paid (cost and tokens their results record) by type and model."""

    def __init__(self, since: datetime) -> None:
        self.since = since
        self.upto = since
        self.counts: dict[tuple[str, str], int] = {}
        self.by_type: dict[str, tuple[_Histogram, _Histogram, _Histogram]] = {}  # duration, wait, attempts
        self.spend: dict[tuple[str, str], _Spend] = {}  # (type, model)
        self.lock = threading.Lock()  # two scrapes at once must not read one range twice

    def advance(self, conn: sa.Connection, until: datetime) -> None:
        """Read the jobs that finished in ``(upto, until]`` through ``ix_tether_jobs_done``."""
        if until <= self.upto:
            return
        window = (
            t.c.status.in_((JobStatus.COMPLETED.value, JobStatus.FAILED.value)),
            finished(),
            t.c.completed_at > self.upto,
            t.c.completed_at <= until,
        )
        # Read into a fresh tally and merge it only once the whole range was read: a read that
        # fails midway leaves the counters as they were, and the next scrape reads the range again.
        tally = _Finished(self.upto)
        if conn.dialect.name == "postgresql":
            tally._add_groups(conn, window)
        else:
            tally._add_rows(conn, window)
        self._merge(tally)
        self.upto = until

    def _merge(self, tally: _Finished) -> None:
        for key, n in tally.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        for job_type, histograms in tally.by_type.items():
            if job_type not in self.by_type:
                self.by_type[job_type] = histograms
                continue
            for mine, theirs in zip(self.by_type[job_type], histograms, strict=True):
                mine.counts = [a + b for a, b in zip(mine.counts, theirs.counts, strict=True)]
                mine.sum += theirs.sum
        for key, spent in tally.spend.items():
            if key not in self.spend:
                self.spend[key] = spent
                continue
            self.spend[key].add(spent.jobs, spent.cost, spent.input_tokens, spent.output_tokens)

    def _spent(self, job_type: str, model: Any) -> _Spend:
        key = (job_type, UNKNOWN_MODEL if model is None else str(model))
        spent = self.spend.get(key)
        if spent is None:
            spent = self.spend[key] = _Spend()
        return spent

    def _histograms(self, job_type: str) -> tuple[_Histogram, _Histogram, _Histogram]:
        hs = self.by_type.get(job_type)
        if hs is None:
            hs = (_Histogram(SECONDS_BUCKETS), _Histogram(SECONDS_BUCKETS), _Histogram(ATTEMPT_BUCKETS))
            self.by_type[job_type] = hs
        return hs

    def _add_rows(self, conn: sa.Connection, window: tuple[Any, ...]) -> None:
        # SQLite: one row per job, bucketed here (SQLite would compute each CASE of a bucket
        # expression anew, slower than this loop). A one-off reading of a busy hour goes through
        # every row of it: kept to plain operations, no call per row.
        dialect = conn.dialect.name
        query = sa.select(
            t.c.status,
            t.c.type,
            t.c.attempts,
            observe.seconds_between(dialect, t.c.claimed_at, t.c.completed_at),
            observe.seconds_between(dialect, t.c.run_at, t.c.claimed_at),
            # What a billed result records, parsed once: [cost, tokens in, tokens out, model].
            sa.case((billing.billed(), billing.sqlite_spent()), else_=None),
        ).where(*window)
        counts, by_type, completed = self.counts, self.by_type, JobStatus.COMPLETED.value
        # julianday() arithmetic is good to ~50 us: against bounds half a millisecond up, a job of
        # exactly 1 s still lands in the 1 s bucket (as it does on PostgreSQL, rounded to the ms).
        seconds, tries_at = _SECONDS_ABOVE, _ATTEMPTS_ABOVE
        for part in conn.execute(query.execution_options(yield_per=10_000)).partitions():
            for status, job_type, attempts, took, waited, spent in part:
                key = (status, job_type)
                counts[key] = counts.get(key, 0) + 1
                if status != completed:
                    continue
                if spent is not None:
                    cost, tokens_in, tokens_out, model = billing.spent_of(orjson.loads(spent))
                    self._spent(job_type, model).add(1, cost, tokens_in, tokens_out)
                if took is None:
                    continue
                hs = by_type.get(job_type) or self._histograms(job_type)
                duration, wait, tries = hs
                if took < 0:
                    took = 0.0
                duration.counts[bisect_left(seconds, took)] += 1
                duration.sum += took
                if waited is None or waited < 0:
                    waited = 0.0
                wait.counts[bisect_left(seconds, waited)] += 1
                wait.sum += waited
                tries.counts[bisect_left(tries_at, attempts)] += 1
                tries.sum += attempts

    def _add_groups(self, conn: sa.Connection, window: tuple[Any, ...]) -> None:
        # PostgreSQL buckets in the server and sends one row per (outcome, type, buckets), not
        # one per job. width_bucket counts the thresholds <= a value. The three buckets travel
        # as one number, so the planner expects few groups and hashes them instead of sorting
        # every job (a sort spilled to disk took twice as long as sending the rows).
        took = sa.func.greatest(0, observe.seconds_between("postgresql", t.c.claimed_at, t.c.completed_at))
        waited = sa.func.greatest(0, observe.seconds_between("postgresql", t.c.run_at, t.c.claimed_at))
        spent = _pg_spent()
        per_job = (
            sa.select(t.c.status, t.c.type, t.c.attempts, took.label("took"), waited.label("waited"), spent)
            .where(*window)
            # A fence: flattened into the query below, the subquery that parses a billed result
            # would run once for every element read of it (four times).
            .offset(0)
            .subquery()
        )
        seconds = sa.cast(sa.literal(list(_SECONDS_ABOVE)), ARRAY(sa.Float))
        tries = sa.cast(sa.literal(list(_ATTEMPTS_ABOVE)), ARRAY(sa.Float))
        model = per_job.c.spent[4]
        key = (
            sa.func.width_bucket(per_job.c.took, seconds) * 10_000
            + sa.func.width_bucket(per_job.c.waited, seconds) * 100
            + sa.func.width_bucket(sa.cast(per_job.c.attempts, sa.Float), tries)
        ).label("k")
        query = sa.select(
            per_job.c.status,
            per_job.c.type,
            key,
            sa.func.count(),
            sa.func.sum(per_job.c.took),
            sa.func.sum(per_job.c.waited),
            sa.func.sum(per_job.c.attempts),
            model,
            sa.func.count(model),  # the jobs whose results record a cost
            *(sa.func.sum(sa.cast(per_job.c.spent[n], sa.Float)) for n in (1, 2, 3)),
        ).group_by(per_job.c.status, per_job.c.type, key, model)
        completed = JobStatus.COMPLETED.value
        for row in conn.execute(query):
            status, job_type, k, n, took_sum, waited_sum, attempts_sum, model, billed, cost, tokens_in, tokens_out = row
            self.counts[(status, job_type)] = self.counts.get((status, job_type), 0) + n
            if status != completed:
                continue
            if billed:
                self._spent(job_type, model).add(billed, cost, tokens_in, tokens_out)
            duration, wait, tries_h = self._histograms(job_type)
            duration.counts[k // 10_000] += n
            duration.sum += took_sum
            wait.counts[k // 100 % 100] += n
            wait.sum += waited_sum
            tries_h.counts[k % 100] += n
            tries_h.sum += attempts_sum

    def types(self) -> set[str]:
        return {name for _, name in self.counts}


class LedgerCollector:
    """Collects, per scrape: jobs waiting, running and failed by type; outstanding, stuck, oldest
    pending age, health; jobs finished since ``since`` by outcome and type, with histograms of
    their run time, queue wait and attempts, and the cost and tokens completed jobs recorded (by
    type and model); the last reconcile verdict.

    ``since`` defaults to now (a served collector counts what finishes while it runs); ``settle``
    is how far behind now it reads finished jobs (``SETTLE``; zero for a one-off reading)."""

    def __init__(
        self,
        source: Source,
        *,
        lock_timeout: float | None = None,
        since: datetime | None = None,
        settle: timedelta = SETTLE,
        thresholds: Thresholds | None = None,
    ) -> None:
        self.source = source
        self.lock_timeout = lock_timeout
        self.settle = settle
        self.thresholds = thresholds or Thresholds()
        self.finished = _Finished(since or now_of(source, None))

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
        s = observe.stats(self.source, lock_timeout=self.lock_timeout, now=now)
        with reading(self.source) as conn:
            failed = _failed_by_type(conn)
            with self.finished.lock:
                self.finished.advance(conn, now - self.settle)
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
        return [done, *histograms, *_spend_families(f.spend, created)]


def _spend_families(spend: dict[tuple[str, str], _Spend], created: float) -> list[Metric]:
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


def _pg_spent() -> Any:
    """PostgreSQL: what a billed result records, as text[] (cost, tokens in, tokens out, model),
    NULL for other jobs; one parse of each billed result, in a subquery run for those alone. (A
    LATERAL join would keep the scan parallel, but the planner moves its LIKE after the parse,
    which then runs for every job read.)"""
    record = billing.pg_record()
    numbers = [sa.cast(billing.pg_number(record.c[k]), sa.Text) for k in billing.SPENT_KEYS]
    values = sa.select(array([*numbers, sa.func.coalesce(record.c.model, UNKNOWN_MODEL)])).select_from(record)
    return sa.case((billing.billed(), values.scalar_subquery()), else_=None).label("spent")


def _failed_by_type(conn: sa.Connection) -> dict[str, int]:
    # The failed range of ix_tether_jobs_done: as many rows as jobs waiting for an operator.
    query = (
        sa.select(t.c.type, sa.func.count()).where(t.c.status == JobStatus.FAILED.value, finished()).group_by(t.c.type)
    )
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


def exposition(source: Source, *, window: timedelta = timedelta(hours=1), **kwargs: Any) -> bytes:
    """One reading in Prometheus text format (0.0.4), the finished-job families counting the last
    ``window``: what ``tether metrics`` prints for a textfile collector."""
    since = now_of(source, None) - window
    return generate_latest(registry(source, process=False, since=since, settle=timedelta(0), **kwargs))


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


__all__ = ["DEFAULT_PORT", "SETTLE", "LedgerCollector", "exposition", "registry", "serve"]
