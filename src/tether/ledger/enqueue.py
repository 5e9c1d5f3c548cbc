"""Inserting jobs: building them, inserting them in a transaction, and what follows the commit.

One path for every enqueue: jobs are built as a list (``build.Builder``; one job is a list of
one), inserted by ``insert_all`` in the caller's transaction or in one of tether's own
(``enqueue``: shared with the enqueues of other threads that arrive meanwhile, groupcommit.py),
and logged and announced to idle workers by ``committed`` once the commit stands. A job whose
idempotency key an active job already holds is not inserted: that job is returned, marked as a
duplicate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from operator import itemgetter
from typing import Any

import orjson
import sqlalchemy as sa

from .. import events
from ..errors import CommitUnknown, DatabaseUnavailable
from ..jobtypes import Payload
from . import conflict, faults
from .backend import Backend, LostCommit
from .build import Builder
from .groupcommit import GroupCommit, Request, own_outcome
from .notes import Note, write_notes
from .record import InsertResult, JobRecord, make_tuple
from .wakeup import Wakeup

# What jobs enqueued together share, by field name (one JSON insert per share); the rest varies.
_shared = itemgetter(
    *map(
        JobRecord._fields.index,
        ("type", "priority", "max_attempts", "created_at", "run_at", "parent_id", "timeout", "traceparent"),
    )
)
# A JSON insert's rows travel as one value: past this many payload characters, another statement.
_JSON_CHARS = 16 << 20
# A transaction of tether's that inserts at least this many jobs may gather the planner's
# statistics (JOBS_COUNTED); smaller ones never pay the extra round trips.
_BULK = 1000


def _behind(jobs: list[JobRecord]) -> list[bool]:
    """Per job of one JSON insert, whether an older job of the same statement has its target
    (the statement does not see its own rows)."""
    first: dict[str, str] = {}
    for job in jobs:
        key = job.ordering_key
        if key is not None and (key not in first or job.id < first[key]):
            first[key] = job.id
    return [job.ordering_key is not None and first[job.ordering_key] != job.id for job in jobs]


def _targeted_rows(jobs: list[JobRecord]) -> list[tuple[str, str, str | None, int | None, bool]]:
    """INSERT_TARGETED's rows: [id, payload, ordering_key, payload_bytes, behind] per job."""
    return [
        (job.id, job.payload, job.ordering_key, job.payload_bytes, behind)
        for job, behind in zip(jobs, _behind(jobs), strict=True)
    ]


def _rows(jobs: list[JobRecord], values: Callable[[JobRecord], tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """INSERT_ROWS' rows of unkeyed ``jobs``: each job's ``values`` as INSERT_UNKEYED binds them
    (``Backend.insert_values``), then its target and whether it is behind."""
    return [(*values(job)[:11], job.ordering_key, behind) for job, behind in zip(jobs, _behind(jobs), strict=True)]


def _by_size(jobs: list[JobRecord]) -> Iterator[list[JobRecord]]:
    """``jobs`` in runs whose payloads add up to at most _JSON_CHARS (at least one job each):
    a file job's payload holds the file, and one statement's text has a size limit."""
    start, size = 0, 0
    for i, job in enumerate(jobs):
        size += len(job.payload)
        if size > _JSON_CHARS and i > start:
            yield jobs[start:i]
            start, size = i, len(job.payload)
    yield jobs[start:]


_REFUSALS = (sa.exc.IntegrityError, sa.exc.DataError)
"""What the database raises for a job it will not store (a constraint, a value out of range)."""


class _Refused(Exception):
    """The database refused the jobs of request ``index`` of a batch (``error``, a refusal)."""

    def __init__(self, index: int, error: sa.exc.StatementError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


class Enqueuer:
    """Builds and inserts jobs for one ledger; ``where`` is the ledger as messages name it."""

    def __init__(self, backend: Backend, builder: Builder, wakeup: Wakeup, where: str) -> None:
        self.backend = backend
        self.builder = builder
        self.wakeup = wakeup
        self.where = where
        self.sql = backend.sql  # the statement catalogue of this ledger's dialect
        self._json_sql = (self.sql.INSERT_PAYLOADS, self.sql.INSERT_TARGETED) if backend.reads_json else None
        # The inserts of one job: with an idempotency key; with a target (it says whether an older
        # job on it holds this one back); with neither.
        self._insert_keyed, self._insert_on_target = self.sql.INSERT, self.sql.INSERT_ON_TARGET
        self._insert_unkeyed_one = self.sql.INSERT_UNKEYED
        self._insert_rows = self.sql.INSERT_ROWS if backend.reads_json else ""
        self.group = GroupCommit(self._commit, backend.commits_at_once)

    def build(self, payloads: Sequence[Payload], **options: Any) -> list[JobRecord]:
        """Validate jobs before a transaction opens; raises InvalidPayload. Options as
        ``build.Builder.build``."""
        return self.builder.build(payloads, **options)

    def enqueue(
        self, jobs: Sequence[JobRecord], notes: Mapping[str, Note] | None = None, *, shared: bool = True
    ) -> list[InsertResult]:
        """Insert ``jobs`` (with the ``notes`` of some, by id) in one transaction; returns after
        the commit is durable. ``shared``: other threads' enqueues may commit in the same
        transaction (group commit); without it the transaction holds these jobs alone."""
        request = Request(jobs, notes)
        if shared:
            self.group.submit(request)
        else:
            self._commit([request])
        results = own_outcome(request)
        self.committed(results)
        return results

    def _commit(self, batch: list[Request]) -> None:
        """One transaction for the requests of ``batch``, setting each one's outcome. A request
        whose own jobs the database refuses (a constraint, a value it cannot store) is given that
        error and the rest are committed without it; any other failure is every request's."""
        pipelined = True
        while batch:
            try:
                outcomes = self.backend.transact(partial(self._insert_batch, batch, pipelined), pipelined=pipelined)
            except _Refused as refused:
                if pipelined and len(batch) > 1:
                    # A pipelined fetch raises the first error of every statement sent before it:
                    # an earlier request's refusal may surface in a later one's insert. Only a run
                    # statement by statement names the request it belongs to.
                    pipelined = False
                    continue
                batch[refused.index].error = self._not_recorded(refused.error, batch[refused.index].jobs)
                batch = batch[: refused.index] + batch[refused.index + 1 :]
                continue
            except sa.exc.SQLAlchemyError as e:
                if pipelined and len(batch) > 1 and isinstance(e, _REFUSALS):
                    # A pipelined refusal comes with the answers of every statement: run again
                    # statement by statement, where it names its request.
                    pipelined = False
                    continue
                for request in batch:
                    request.error = self._not_recorded(e, request.jobs)
                return
            for request, results in zip(batch, outcomes, strict=True):
                request.results = results
            return

    def _gather_statistics(self, cur: Any, inserted: int) -> None:
        """In the transaction that inserts ``inserted`` jobs: gather the planner's statistics of
        the jobs table when they count fewer than ten times as many rows (JOBS_COUNTED in the
        catalogue says why), so the jobs and the statistics that plan their claims commit together.
        ANALYZE comes last: its lock is one another bulk enqueue waits for, and this transaction
        waits for nothing once it holds it."""
        counted = cur.scalar(self.sql.JOBS_COUNTED)
        if counted < 0 or inserted * 10 >= counted:
            cur.send(self.sql.ANALYZE_JOBS)

    def _insert_batch(self, batch: list[Request], together: bool, cur: Any) -> list[list[InsertResult]]:
        """Each request's jobs in the transaction of ``cur`` (built afresh on each run of it:
        Backend.transact), all in one statement where they can be (``together``, and
        ``_insert_together``); one wake-up for other processes, if any job is new."""
        outcomes = self._insert_together(batch, cur) if together else None
        if outcomes is None:
            outcomes = []
            for i, request in enumerate(batch):
                try:
                    results = self.insert_all(cur, request.jobs, request.notes)
                except self.backend.refusals as e:
                    raise _Refused(i, self.backend.wrap(e)) from e
                outcomes.append(results)
        inserted = sum(map(len, outcomes))
        if inserted >= _BULK and self.sql.ANALYZE_JOBS:
            self._gather_statistics(cur, inserted)
        if self.wakeup.sends and any(not r.duplicate for results in outcomes for r in results):
            self.wakeup.notify_after_commit(cur)
        return outcomes

    def _insert_together(self, batch: list[Request], cur: Any) -> list[list[InsertResult]] | None:
        """The jobs of several requests in one INSERT_ROWS (one a run of payloads that one
        statement carries), where the catalogue has it and no job has a key or notes; else None,
        nothing inserted. A refusal then names no request: ``_commit`` runs the batch again
        statement by statement, where it does."""
        if not self._insert_rows or len(batch) < 2:
            return None
        jobs: list[JobRecord] = []
        for request in batch:
            if request.notes:
                return None
            for job in request.jobs:
                if job.idempotency_key is not None:
                    return None
                jobs.append(job)
        for part in _by_size(jobs):
            cur.insert(self._insert_rows, {"rows": orjson.dumps(_rows(part, self.backend.insert_values)).decode()})
        return [[make_tuple(InsertResult, (job, False)) for job in request.jobs] for request in batch]

    def insert_all(
        self, cur: Any, jobs: Sequence[JobRecord], notes: Mapping[str, Note] | None = None
    ) -> list[InsertResult]:
        """Insert many in the caller's transaction: unkeyed jobs that share their options in one
        statement, keyed ones one at a time (each may meet an active job with its key); then the
        ``notes`` (by job id) of the jobs inserted, not of those found by their key."""
        # Loops rather than comprehensions: each of those is a call of its own, on every enqueue.
        unkeyed = []
        for job in jobs:
            if job.idempotency_key is None:
                unkeyed.append(job)
        if len(unkeyed) == 1:
            job = unkeyed[0]
            insert = self._insert_unkeyed_one if job.ordering_key is None else self._insert_on_target
            cur.insert(insert, self.backend.insert_values(job))
        elif unkeyed:
            self._insert_unkeyed(cur, unkeyed)
        results = []
        for job in jobs:
            if job.idempotency_key is None:
                results.append(make_tuple(InsertResult, (job, False)))
            else:
                results.append(self._insert_keyed_job(cur, job))
        if notes:
            inserted = {r.job.id for r in results if not r.duplicate}
            write_notes(cur, self.sql, {job_id: n for job_id, n in notes.items() if job_id in inserted})
        return results

    def _insert_keyed_job(self, cur: Any, job: JobRecord) -> InsertResult:
        """Insert ``job`` (it has an idempotency key); an active job with the same key is returned."""
        while True:
            inserted = cur.insert_returning(self._insert_keyed, self.backend.insert_values(job))
            if inserted is not None:
                return InsertResult(inserted)
            existing = cur.record(self.sql.ACTIVE_BY_KEY, {"type": job.type, "idempotency_key": job.idempotency_key})
            if existing is not None:
                return InsertResult(existing, duplicate=True)
            # PostgreSQL only: the conflicting job finished between the two statements.

    def active_with_key(self, job: JobRecord) -> JobRecord | None:
        """The active job holding ``job``'s type and idempotency key, if any (a read)."""
        with self.backend.read() as cur:
            return cur.record(self.sql.ACTIVE_BY_KEY, {"type": job.type, "idempotency_key": job.idempotency_key})

    def _insert_unkeyed(self, cur: Any, jobs: list[JobRecord]) -> None:
        groups: dict[tuple[Any, ...], list[JobRecord]] = {}
        for job in jobs:
            groups.setdefault(_shared(job), []).append(job)
        # Jobs that share nothing (each from its own enqueue call, as in a transaction() block)
        # go in one executemany; the rest in one JSON insert per share and size.
        alone = [job for group in groups.values() if len(group) == 1 or self._json_sql is None for job in group]
        on_target = [job for job in alone if job.ordering_key is not None]
        if len(on_target) < len(alone):
            values = [self.backend.insert_values(job) for job in alone if job.ordering_key is None]
            cur.insert(self.sql.INSERT_UNKEYED, values)
        if on_target:  # in id order, so each sees the older ones on its target
            values = [self.backend.insert_values(job) for job in sorted(on_target, key=lambda j: j.id)]
            cur.insert(self._insert_on_target, values)
        if self._json_sql is not None:
            for shared, group in groups.items():
                if len(group) > 1:
                    self._insert_json(cur, shared, group)

    def _insert_json(self, cur: Any, shared: tuple[Any, ...], group: list[JobRecord]) -> None:
        """Jobs that share their options (``shared``, as ``_shared`` reads them) in one JSON
        insert per run of payloads that one statement can carry."""
        assert self._json_sql is not None
        untargeted, targeted = self._json_sql
        job_type, priority, max_attempts, created_at, run_at, parent_id, timeout, traceparent = shared
        values = {
            "type": job_type,
            "priority": priority,
            "max_attempts": max_attempts,
            "created_at": created_at,
            "run_at": run_at,
            "parent_id": parent_id,
            "timeout": timeout,
            "traceparent": traceparent,
        }
        for part in _by_size(group):
            if any(job.ordering_key is not None for job in part):
                cur.send(targeted, {**values, "rows": orjson.dumps(_targeted_rows(part)).decode()})
            else:
                rows = orjson.dumps({job.id: job.payload for job in part}).decode()
                cur.send(untargeted, {**values, "rows": rows})

    def _not_recorded(self, e: sa.exc.SQLAlchemyError, jobs: Sequence[JobRecord]) -> Exception:
        """What an enqueue of ``jobs`` whose transaction failed raises: CommitUnknown (the
        connection was lost during COMMIT: they may have been recorded), TransactionConflict, a
        LedgerFault, DatabaseUnavailable (nothing was enqueued, try again), or ``e`` itself."""
        if isinstance(e, LostCommit):
            return CommitUnknown([job.id for job in jobs], faults.describe(e))
        if conflict.is_conflict(e):  # every run of the transaction met one (Backend.transact)
            return conflict.unresolved(e)
        fault = faults.ledger_fault(e, self.where)
        if fault is not None:
            return fault
        if not isinstance(e, sa.exc.OperationalError):
            return e
        return DatabaseUnavailable(f"could not record the job(s), nothing was enqueued: {e.orig}")

    def committed(self, results: Iterable[InsertResult]) -> None:
        """After a commit that inserted jobs: log them and wake idle workers."""
        any_new = False
        log = events.enabled()
        for r in results:
            if not r.duplicate:
                any_new = True
                if log:
                    events.emit(
                        "queued", job_id=r.job.id, type=r.job.type, priority=r.job.priority, parent_id=r.job.parent_id
                    )
            elif log:
                events.emit("deduplicated", job_id=r.job.id, type=r.job.type)
        if any_new:
            self.wakeup.wake_local()  # other processes were notified by the commit itself
