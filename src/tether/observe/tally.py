"""Jobs finished since a collector's previous scrape, tallied as Prometheus keeps them:
counts by outcome and type, cumulative histograms of run time, queue wait and attempts by type,
and what completed jobs paid by type and model (``metrics`` exposes the tally).

Only the jobs that finished in the new range are read, an index range on ``completed_at``:
SQLite sends one row per job, bucketed here; PostgreSQL buckets in the server.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, array

from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from . import billing
from .readonly import done, one_in, seconds_between

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
ATTEMPT_BUCKETS = (1, 2, 3, 5, 10)
# Each bound plus half a resolution step (1 ms, 1 attempt): the count of these below a value is
# the bucket of a value measured to that resolution, a value on a bound included in it (le).
_SECONDS_ABOVE = tuple(b + 0.0005 for b in SECONDS_BUCKETS)
_ATTEMPTS_ABOVE = tuple(b + 0.5 for b in ATTEMPT_BUCKETS)
UNKNOWN_MODEL = "unknown"
"""The model label of a cost whose result names no model."""


class Histogram:
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


class SpendSum:
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


# Every status a job finishes in: each is counted (tether_jobs_finished_total{status}).
_FINISHED = (JobStatus.COMPLETED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value)


class FinishedTally:
    """Jobs that finished after ``since``, accumulated as they are read: counts by outcome and
    type; run time, queue wait and attempts of completed jobs by type; and what completed jobs
    paid (cost and tokens their results record) by type and model."""

    def __init__(self, since: datetime) -> None:
        self.since = since
        self.upto = since
        self.counts: dict[tuple[str, str], int] = {}
        self.by_type: dict[str, tuple[Histogram, Histogram, Histogram]] = {}  # duration, wait, attempts
        self.spend: dict[tuple[str, str], SpendSum] = {}  # (type, model)
        self.every: dict[str, int] = {}  # per outcome, 1 in how many jobs a sampled reading read
        self.lock = threading.Lock()  # two scrapes at once must not read one range twice

    def advance(self, conn: sa.Connection, until: datetime, *, sample: int | None = None) -> None:
        """Read the jobs that finished in ``(upto, until]`` through ``ix_tether_jobs_done``: every
        one, or with ``sample``, about that many of each outcome at most: of an outcome with n
        jobs in the range, the one in k = ceil(n / sample) that ``readonly.one_in`` chooses,
        each counted k times (``every`` says k per outcome)."""
        if until <= self.upto:
            return
        statuses: dict[str, int] = dict.fromkeys(_FINISHED, 1)
        if sample is not None:
            counted = sa.select(jobs_table.c.status, sa.func.count()).where(*self._range(_FINISHED, until))
            statuses = {
                status: max(1, -(-n // sample)) for status, n in conn.execute(counted.group_by(jobs_table.c.status))
            }
        # Read into a fresh tally and merge it only once the whole range was read: a read that
        # fails midway leaves the counters as they were, and the next scrape reads the range again.
        tally = FinishedTally(self.upto)
        for every in sorted(set(statuses.values())):
            chosen = tuple(status for status, k in statuses.items() if k == every)
            window = self._range(chosen, until)
            if every > 1:
                window = (*window, one_in(conn.dialect.name, every))
            if conn.dialect.name == "postgresql":
                tally._add_groups(conn, window, every)
            else:
                tally._add_rows(conn, window, every)
        if sample is not None:
            tally.every = statuses
        self._merge(tally)
        self.upto = until

    def _range(self, statuses: tuple[str, ...], until: datetime) -> tuple[Any, ...]:
        return (
            jobs_table.c.status.in_(statuses),
            done(),
            jobs_table.c.completed_at > self.upto,
            jobs_table.c.completed_at <= until,
        )

    def _merge(self, tally: FinishedTally) -> None:
        for key, n in tally.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        for job_type, histograms in tally.by_type.items():
            if job_type not in self.by_type:
                self.by_type[job_type] = histograms
                continue
            for mine, theirs in zip(self.by_type[job_type], histograms, strict=True):
                mine.counts = [a + b for a, b in zip(mine.counts, theirs.counts, strict=True)]
                mine.sum += theirs.sum
        self.every.update(tally.every)
        for key, spent in tally.spend.items():
            if key not in self.spend:
                self.spend[key] = spent
                continue
            self.spend[key].add(spent.jobs, spent.cost, spent.input_tokens, spent.output_tokens)

    def _spent(self, job_type: str, model: Any) -> SpendSum:
        key = (job_type, UNKNOWN_MODEL if model is None else str(model))
        spent = self.spend.get(key)
        if spent is None:
            spent = self.spend[key] = SpendSum()
        return spent

    def _histograms(self, job_type: str) -> tuple[Histogram, Histogram, Histogram]:
        hs = self.by_type.get(job_type)
        if hs is None:
            hs = (Histogram(SECONDS_BUCKETS), Histogram(SECONDS_BUCKETS), Histogram(ATTEMPT_BUCKETS))
            self.by_type[job_type] = hs
        return hs

    def _add_rows(self, conn: sa.Connection, window: tuple[Any, ...], w: int) -> None:
        # SQLite: one row per job, bucketed here (SQLite would compute each CASE of a bucket
        # expression anew, slower than this loop); each row counts ``w`` jobs (a sample's one in
        # w). Kept to plain operations, no call per row.
        dialect = conn.dialect.name
        query = sa.select(
            jobs_table.c.status,
            jobs_table.c.type,
            jobs_table.c.attempts,
            seconds_between(dialect, jobs_table.c.claimed_at, jobs_table.c.completed_at),
            seconds_between(dialect, jobs_table.c.run_at, jobs_table.c.claimed_at),
            # What a billed result records, parsed once: [cost, tokens in, tokens out, model].
            sa.case((billing.billed(), billing.sqlite_spent()), else_=None),
        ).where(*window)
        counts, by_type, completed = self.counts, self.by_type, JobStatus.COMPLETED.value
        # julianday() arithmetic is not exact below the millisecond: against bounds half a
        # millisecond up, a job of exactly 1 s still lands in the 1 s bucket (as on PostgreSQL).
        seconds, tries_at = _SECONDS_ABOVE, _ATTEMPTS_ABOVE
        for part in conn.execute(query.execution_options(yield_per=10_000)).partitions():
            for status, job_type, attempts, took, waited, spent in part:
                key = (status, job_type)
                counts[key] = counts.get(key, 0) + w
                if status != completed:
                    continue
                if spent is not None:
                    cost, tokens_in, tokens_out, model = billing.spent_of(orjson.loads(spent))
                    self._spent(job_type, model).add(w, *_times(w, cost, tokens_in, tokens_out))
                if took is None:
                    continue
                hs = by_type.get(job_type) or self._histograms(job_type)
                duration, wait, tries = hs
                if took < 0:
                    took = 0.0
                duration.counts[bisect_left(seconds, took)] += w
                duration.sum += took * w
                if waited is None or waited < 0:
                    waited = 0.0
                wait.counts[bisect_left(seconds, waited)] += w
                wait.sum += waited * w
                tries.counts[bisect_left(tries_at, attempts)] += w
                tries.sum += attempts * w

    def _add_groups(self, conn: sa.Connection, window: tuple[Any, ...], w: int) -> None:
        # PostgreSQL buckets in the server (``_grouped``), so few rows travel; each job read
        # counts ``w`` jobs (a sample's one in w).
        query = _grouped(window)
        completed = JobStatus.COMPLETED.value
        for row in conn.execute(query):
            status, job_type, k, n, took_sum, waited_sum, attempts_sum, model, billed, cost, tokens_in, tokens_out = row
            n *= w
            self.counts[(status, job_type)] = self.counts.get((status, job_type), 0) + n
            if status != completed:
                continue
            if billed:
                self._spent(job_type, model).add(billed * w, *_times(w, cost, tokens_in, tokens_out))
            duration, wait, tries_h = self._histograms(job_type)
            duration.counts[k // 10_000] += n
            duration.sum += took_sum * w
            wait.counts[k // 100 % 100] += n
            wait.sum += waited_sum * w
            tries_h.counts[k % 100] += n
            tries_h.sum += attempts_sum * w

    def types(self) -> set[str]:
        return {name for _, name in self.counts}


def _times(w: int, *values: float | None) -> list[float | None]:
    return [None if v is None else v * w for v in values]


def _pg_spent() -> Any:
    """PostgreSQL: what a billed result records, as text[] (cost, tokens in, tokens out, model),
    NULL for other jobs; one parse of each billed result, in a subquery run for those alone. (A
    LATERAL join would keep the scan parallel, but the planner moves its LIKE after the parse,
    which then runs for every job read.)"""
    record = billing.pg_record()
    numbers = [sa.cast(billing.pg_number(record.c[k]), sa.Text) for k in billing.SPENT_KEYS]
    values = sa.select(array([*numbers, sa.func.coalesce(record.c.model, UNKNOWN_MODEL)])).select_from(record)
    return sa.case((billing.billed(), values.scalar_subquery()), else_=None).label("spent")


def _grouped(window: tuple[Any, ...]) -> sa.Select[Any]:
    """PostgreSQL: the window's jobs as rows of (status, type, buckets key, count, sums of run
    time, wait and attempts, model, billed jobs, sums of cost and tokens)."""
    # One row per (outcome, type, buckets), not one per job. width_bucket counts the thresholds
    # <= a value. The three buckets travel as one number, so the planner expects few groups and
    # hashes them instead of sorting every job (a sort of a busy window spills to disk).
    took = sa.func.greatest(0, seconds_between("postgresql", jobs_table.c.claimed_at, jobs_table.c.completed_at))
    waited = sa.func.greatest(0, seconds_between("postgresql", jobs_table.c.run_at, jobs_table.c.claimed_at))
    spent = _pg_spent()
    per_job = (
        sa.select(
            jobs_table.c.status,
            jobs_table.c.type,
            jobs_table.c.attempts,
            took.label("took"),
            waited.label("waited"),
            spent,
        )
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
    return sa.select(
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
