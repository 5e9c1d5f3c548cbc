"""The ledger's operations: enqueue, claim, and every status change through one guarded function."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import sqlalchemy as sa

from .. import events
from ..clock import Clock, DatabaseClock
from ..config import DEFAULT_BATCH_BYTES
from ..errors import (
    CommitUnknown,
    DatabaseUnavailable,
    DuplicateActiveJob,
    InvalidTransition,
    JobNotFound,
    LostLease,
    Superseded,
)
from ..jobtypes import Payload, Registry
from ..jobtypes.target import display
from ..outcome import encode_result
from . import conflict, drivers, faults
from .backend import LostCommit
from .build import Builder
from .catalogue import Statements
from .engine import ledger_name
from .limits import DEFAULT_MAX_PAYLOAD_BYTES
from .reclaim import SUSPECT, verdicts
from .record import InsertResult, JobRecord, make_tuple
from .status import ENDING, FENCED, SWEPT, TRANSITIONS, JobStatus
from .wakeup import Wakeup

_EDGE_SQL = {  # each edge's statement, by its name in the catalogue
    "complete": "COMPLETE",
    "retry": "RETRY",
    "fail": "FAIL",
    "release": "RELEASE",
    "defer": "DEFER",
    "snooze": "DEFER",  # the same row change, without holding back the type's other jobs
    "manual_retry": "MANUAL_RETRY",
    "reclaim": "RECLAIM",
    "reclaim_exhausted": "RECLAIM_EXHAUSTED",
}
_EDGE_EVENT = {
    "claim": "claimed",
    "complete": "completed",
    "retry": "retrying",
    "fail": "failed",
    "release": "released",
    "defer": "deferred",
    "snooze": "snoozed",
    "reclaim": "reclaimed",
    "reclaim_exhausted": "failed",
    "manual_retry": "requeued",
}


class Decision(NamedTuple):
    """What to record for one finished attempt: a fenced edge out of ``claimed`` and its values
    (one per job a worker runs: a NamedTuple, as cheap to build as JobRecord)."""

    job: JobRecord
    edge: str  # complete | retry | fail | release
    values: dict[str, Any]
    children: Sequence[JobRecord] = ()
    duration: float | None = None
    finished_at: datetime | None = None  # when the handler returned (not when the group committed)

    def after(self) -> JobRecord:
        """The job as this decision leaves it (for its event, when the row was not read back)."""
        attempts = self.job.attempts - 1 if self.edge in ("release", "defer", "snooze") else self.job.attempts
        return self.job._replace(
            attempts=attempts,
            run_at=self.values.get("run_at", self.job.run_at),
            last_error=self.values.get("error", self.job.last_error),
        )

    @classmethod
    def complete(
        cls,
        job: JobRecord,
        result: Any,
        children: Sequence[JobRecord] = (),
        duration: float | None = None,
        finished_at: datetime | None = None,
    ) -> Decision:
        return cls(job, "complete", {"result": encode_result(job.type, result)}, children, duration, finished_at)

    @classmethod
    def retry(cls, job: JobRecord, error: str, run_at: datetime, duration: float | None = None) -> Decision:
        return cls(job, "retry", {"error": error, "run_at": run_at}, duration=duration)

    @classmethod
    def fail(
        cls, job: JobRecord, error: str, duration: float | None = None, finished_at: datetime | None = None
    ) -> Decision:
        return cls(job, "fail", {"error": error}, duration=duration, finished_at=finished_at)

    @classmethod
    def release(cls, job: JobRecord, duration: float | None = None) -> Decision:
        """Given back untouched (shutdown, a batch that turned slow): the attempt is not counted."""
        return cls(job, "release", {}, duration=duration)

    @classmethod
    def defer(cls, job: JobRecord, error: str, run_at: datetime, duration: float | None = None) -> Decision:
        """Given back until ``run_at`` (a rate limit's reset), with every pending job of its type:
        the attempt is not counted."""
        return cls(job, "defer", {"error": error, "run_at": run_at}, duration=duration)

    @classmethod
    def snooze(cls, job: JobRecord, error: str, run_at: datetime, duration: float | None = None) -> Decision:
        """Given back until ``run_at`` for a cause outside the job (its data root is full): the
        attempt is not counted, and the type's other jobs are not held back."""
        return cls(job, "snooze", {"error": error, "run_at": run_at}, duration=duration)


# What varies between jobs enqueued together, and what they share (one JSON insert per share).
# type, priority, max_attempts, created_at, run_at, parent_id, timeout
_shared = itemgetter(1, 4, 6, 10, 13, 16, 18)
# A JSON insert's rows travel as one value: past this many payload characters, another statement.
_JSON_CHARS = 16 << 20


def _targeted_rows(jobs: list[JobRecord]) -> list[tuple[str, str, str | None, int | None, bool]]:
    """[id, payload, ordering_key, payload_bytes, behind] per job of one JSON insert: ``behind``
    when an older job of the same statement has its target (the statement does not see its own
    rows)."""
    first: dict[str, str] = {}
    for job in jobs:
        key = job.ordering_key
        if key is not None and (key not in first or job.id < first[key]):
            first[key] = job.id
    return [
        (
            job.id,
            job.payload,
            job.ordering_key,
            job.payload_bytes,
            job.ordering_key is not None and first[job.ordering_key] != job.id,
        )
        for job in jobs
    ]


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


def _with_payloads(cur: Any, claimed: list[JobRecord], payload: str) -> list[JobRecord]:
    """Claimed jobs with every payload: those the claim left out (over ``catalogue.INLINE_PAYLOAD``
    bytes) read now, each by its own statement (``payload``), so one is in flight at a time."""
    if all(job.payload is not None for job in claimed):
        return claimed
    return [
        job if job.payload is not None else job._replace(payload=cur.scalar(payload, {"id": job.id})) for job in claimed
    ]


class Queue:
    def __init__(
        self,
        engine: sa.Engine,
        *,
        clock: Clock,
        registry: Registry,
        root: Path,
        wakeup: Wakeup,
        ledger_id: str,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.registry = registry
        self.root = root
        self.wakeup = wakeup
        self.backend = drivers.for_engine(engine)
        self._claim_types: tuple[int, Any] = (-1, None)  # (registry generation, CLAIM's types)
        self._limits: dict[str, int] = {}
        self._limits_generation = -1
        self._last_claim_at: dict[str, datetime] = {}  # by worker id
        self._claim_time_lock = threading.Lock()
        self.builder = Builder(registry, root, clock, max_payload_bytes=max_payload_bytes)
        self.ledger_id = ledger_id  # what the AWS resources its jobs own are tagged with
        self.sql: Statements = self.backend.sql
        json_sql = (self.sql.INSERT_PAYLOADS, self.sql.INSERT_TARGETED)
        self._json_sql = json_sql if self.backend.reads_json else None
        self._complete_many_sql = self.sql.COMPLETE_MANY if self.backend.reads_json else None
        self._insert_keyed, self._insert_on_target = self.sql.INSERT, self.sql.INSERT_ON_TARGET
        self._edge_sql = {edge: getattr(self.sql, name) for edge, name in _EDGE_SQL.items()}
        # The worker's edges as its group commits record them: the same row change, no row read back.
        self._edge_sql_no_return = {
            edge: getattr(self.sql, f"{name}_NO_RETURN")
            for edge, name in _EDGE_SQL.items()
            if edge in ("complete", "retry", "fail", "release", "defer", "snooze")
        }

    def _claimed_types(self) -> Any:
        """CLAIM's ``types``: this registry's types, bound again only when a type is registered."""
        generation, types = self._claim_types
        if generation != self.registry.generation:
            types = self.sql.types(self.registry.names())
            self._claim_types = (self.registry.generation, types)
        return types

    @property
    def where(self) -> str:
        """The ledger as messages name it (``engine.ledger_name``)."""
        return ledger_name(self.engine)

    # -- enqueue ---------------------------------------------------------------------------

    def build(self, payload: Payload, **options: Any) -> JobRecord:
        """Validate everything about a job before a transaction opens; raises InvalidPayload.
        Options as ``build.Builder.build_many``."""
        return self.builder.build_many([payload], **options)[0]

    def insert(self, cur: Any, job: JobRecord) -> InsertResult:
        """Insert inside the caller's transaction; an active job with the same key is returned."""
        while True:
            inserted = cur.record(self._insert_keyed, self.backend.insert_values(job))
            if inserted is not None:
                return InsertResult(inserted)
            existing = cur.record(self.sql.ACTIVE_BY_KEY, {"type": job.type, "idempotency_key": job.idempotency_key})
            if existing is not None:
                return InsertResult(existing, duplicate=True)
            # PostgreSQL only: the conflicting job finished between the two statements.

    def insert_all(self, cur: Any, jobs: Sequence[JobRecord]) -> list[InsertResult]:
        """Insert many in the caller's transaction: unkeyed jobs that share their options in one
        statement, keyed ones one at a time (each may meet an active job with its key)."""
        unkeyed = [job for job in jobs if job.idempotency_key is None]
        if len(unkeyed) == 1:
            cur.execute(self._insert_one(unkeyed[0]), self.backend.insert_values(unkeyed[0]))
        elif unkeyed:
            self._insert_unkeyed(cur, unkeyed)
        return [
            make_tuple(InsertResult, (job, False)) if job.idempotency_key is None else self.insert(cur, job)
            for job in jobs
        ]

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
            cur.executemany(self.sql.INSERT_UNKEYED, values)
        if on_target:  # in id order, so each sees the older ones on its target
            values = [self.backend.insert_values(job) for job in sorted(on_target, key=lambda j: j.id)]
            cur.executemany(self._insert_on_target, values)
        if self._json_sql is None:
            return
        untargeted, targeted = self._json_sql
        for (job_type, priority, max_attempts, created_at, run_at, parent_id, timeout), group in groups.items():
            if len(group) == 1:
                continue
            shared = {
                "type": job_type,
                "priority": priority,
                "max_attempts": max_attempts,
                "created_at": created_at,
                "run_at": run_at,
                "parent_id": parent_id,
                "timeout": timeout,
            }
            for part in _by_size(group):
                if any(job.ordering_key is not None for job in part):
                    rows = orjson.dumps(_targeted_rows(part))
                    cur.execute(targeted, {**shared, "rows": rows.decode()})
                else:
                    cur.execute(
                        untargeted, {**shared, "rows": orjson.dumps({job.id: job.payload for job in part}).decode()}
                    )

    def _insert_one(self, job: JobRecord) -> str:
        """The insert of one job without an idempotency key: with a target, the one that says
        whether an older job on it holds this one back."""
        return self.sql.INSERT_UNKEYED if job.ordering_key is None else self._insert_on_target

    def enqueue_one(self, job: JobRecord) -> InsertResult:
        """``enqueue_all([job])[0]``: a job without an idempotency key, on a ledger whose
        wake-ups need no message, is one INSERT that is its own transaction, and no list is made."""
        if job.idempotency_key is not None or not self.wakeup.in_process_only:
            return self.enqueue_all([job])[0]
        try:
            if job.ordering_key is None:
                self.backend.insert_alone(job)
            else:
                self.backend.execute_alone(self._insert_on_target, self.backend.insert_values(job))
        except sa.exc.SQLAlchemyError as e:
            raise self._not_recorded(e, (job,)) from e
        result = make_tuple(InsertResult, (job, False))
        if events.enabled():
            self.committed((result,))
        else:  # all committed() does for one new job when no event is logged
            self.wakeup.wake_local()
        return result

    def enqueue_all(self, jobs: Sequence[JobRecord]) -> list[InsertResult]:
        """Insert ``jobs`` in one transaction; returns after the commit is durable."""
        if len(jobs) == 1 and jobs[0].idempotency_key is None and self.wakeup.in_process_only:
            return [self.enqueue_one(jobs[0])]
        try:
            results = self.backend.transact(lambda cur: self._insert_and_notify(cur, jobs))
        except sa.exc.SQLAlchemyError as e:
            raise self._not_recorded(e, jobs) from e
        self.committed(results)
        return results

    def _insert_and_notify(self, cur: Any, jobs: Sequence[JobRecord]) -> list[InsertResult]:
        results = self.insert_all(cur, jobs)
        if any(not r.duplicate for r in results):
            self.wakeup.notify_in(cur)
        return results

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

    # -- claim -----------------------------------------------------------------------------

    def claim(
        self, worker: str, *, now: datetime | None = None, limit: int = 1, max_bytes: int = DEFAULT_BATCH_BYTES
    ) -> list[JobRecord]:
        """Atomically take up to ``limit`` ready jobs: highest priority first, then oldest, with at
        most ``max_bytes`` of payload between them, or one larger job (CLAIM in
        ``statements/sqlite.sql``: a job larger than the batch's share waits for the claim it
        leads)."""
        now = now or self.clock.now()
        rows = self.backend.transact(lambda cur: self._claim_in(cur, worker, now, limit, max_bytes))
        return self._claimed(rows, worker)

    def _claim_in(self, cur: Any, worker: str, now: datetime, limit: int, max_bytes: int) -> list[JobRecord]:
        now = self._claim_time(worker, now)
        limited = self._limited()
        if limited:
            return self._claim_limited(cur, worker, now, limit, max_bytes, limited)
        params = {"worker": worker, "now": now, "limit": limit, "max_bytes": max_bytes, "types": self._claimed_types()}
        return _with_payloads(cur, cur.records(self.sql.CLAIM, params), self.sql.PAYLOAD)

    def _claim_time(self, worker: str, now: datetime) -> datetime:
        """``now``, or a microsecond past ``worker``'s last claim: each claim of a worker gets a
        time of its own, since the stale sweep tells one claim from another by (locked_by,
        claimed_at) (reclaim.py), and a worker's threads share its id and may read the clock in
        the same microsecond (a frozen test clock always does)."""
        with self._claim_time_lock:
            last = self._last_claim_at.get(worker)
            if last is not None and now <= last:
                now = last + timedelta(microseconds=1)
            self._last_claim_at[worker] = now
        return now

    # -- per-type concurrency limits: only when a registered type has max_running ------------

    def _limited(self) -> dict[str, int]:
        """Registered types with a ``max_running`` limit (by name, sorted: every worker locks
        them in one order)."""
        if self._limits_generation != self.registry.generation:
            found = {}
            for name in self.registry.names():
                cap = self.registry.get(name).max_running
                if cap is not None:
                    found[name] = int(cap)
            self._limits, self._limits_generation = found, self.registry.generation
        return self._limits

    def _claim_limited(
        self, cur: Any, worker: str, now: datetime, limit: int, max_bytes: int, limited: dict[str, int]
    ) -> list[JobRecord]:
        """The claim, with each limited type taken only up to its room: ``max_running`` minus its
        jobs claimed now, across every worker (counted in the claiming transaction). The byte cap
        spans the statements: each later one has what the batch has left, and takes at least one
        job while any is left (a batch may end one job past ``max_bytes``, never starving a
        limited type of large jobs)."""
        dialect = self.engine.dialect.name
        params: dict[str, Any] = {"worker": worker, "now": now, "limit": limit, "max_bytes": max_bytes}
        unlimited = [name for name in self.registry.names() if name not in limited]
        claimed: list[JobRecord] = cur.records(self.sql.CLAIM, {**params, "types": self.sql.types(unlimited)})
        for name, cap in limited.items():
            left = max_bytes - sum(job.payload_bytes or 0 for job in claimed)
            if len(claimed) >= limit or (claimed and left <= 0):
                break
            if dialect == "postgresql":
                cur.scalar(self.sql.LOCK_TYPE_CLAIMS, {"lock": f"tether.max_running.{name}"})
            room = min(limit - len(claimed), cap - int(cur.scalar(self.sql.RUNNING_OF_TYPE, {"type": name})))
            if room > 0:
                of_type = {**params, "limit": room, "max_bytes": left, "types": self.sql.types([name])}
                claimed += cur.records(self.sql.CLAIM, of_type)
        return _with_payloads(cur, claimed, self.sql.PAYLOAD)

    def _claimed(self, rows: list[JobRecord], worker: str) -> list[JobRecord]:
        jobs = sorted(rows, key=lambda j: (-j.priority, j.created_at, j.id))
        if events.enabled():
            for job in jobs:
                self._event("claim", job, worker)
        return jobs

    # -- transitions -----------------------------------------------------------------------

    def transition(
        self,
        cur: Any,
        edge: str,
        job_id: str,
        *,
        worker: str | None = None,
        attempt: int | None = None,
        returning: bool = True,
        **values: Any,
    ) -> JobRecord | bool | None:
        """The one way a single job changes status (``complete_many`` is its ``complete`` edge for
        a group commit). Fenced edges apply only while the job is still claimed by ``worker`` for
        ``attempt``; None means the guard did not match. With ``returning=False`` (the worker's
        group commits) the changed row is not read back, and True says it changed: parsing the
        row cost a quarter of a no-op job's CPU."""
        from_status, to_status = TRANSITIONS[edge]
        params: dict[str, Any] = {"id": job_id, **values}
        if edge in FENCED or edge in SWEPT:
            if worker is None or attempt is None:
                raise ValueError(f"{edge} is fenced: worker and attempt are required")
            params.update(worker=worker, attempt=attempt)
        if not returning:
            return True if cur.execute(self._edge_sql_no_return[edge], params) == 1 else None
        job: JobRecord | None = cur.record(self._edge_sql[edge], params)
        if job is not None:
            assert job.status is to_status, (edge, from_status, job.status)
        return job

    def complete_many(
        self, cur: Any, worker: str, decisions: Sequence[Decision], now: datetime
    ) -> set[tuple[str, int]]:
        """``transition(cur, "complete", ...)`` for several of ``worker``'s jobs (distinct ids) in
        one statement, each fenced exactly as ``transition`` fences it; returns the (id, attempt)
        pairs that moved: the others lost their lease."""
        time = self.backend.time
        rows = {d.job.id: (d.job.attempts, time(d.finished_at or now), d.values["result"]) for d in decisions}
        if len(rows) != len(decisions):
            raise ValueError("complete_many: each job once")
        moved = cur.rows(self._complete_many_sql, {"worker": worker, "rows": orjson.dumps(rows).decode()})
        return {(job_id, attempts) for job_id, attempts in moved}

    def finish(self, worker: str, decisions: Sequence[Decision], *, records: bool = True) -> list[Any]:
        """Record the outcomes of several of ``worker``'s jobs in one transaction (a group
        commit). Each is fenced on its own: where the lease was lost the entry is None, a
        ``lost_lease`` event is logged, and the others still apply. Follow-up jobs are inserted
        only for jobs that completed. Entries are the changed rows, or with ``records=False``
        True."""
        moved, _ = self.finish_and_claim(worker, decisions, records=records)
        return moved

    def finish_and_claim(
        self,
        worker: str,
        decisions: Sequence[Decision],
        *,
        records: bool = True,
        claim: int = 0,
        claim_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> tuple[list[Any], list[JobRecord]]:
        """``finish``, then in the same transaction claim up to ``claim`` next jobs (holding at
        most ``claim_bytes`` of payload, or one job): a draining worker pays one durable commit
        per batch instead of two. Both parts are exactly what ``finish`` and ``claim`` do alone; a
        crash before the commit undoes both."""
        now = self.clock.now()
        # The worker's group commits (records=False) complete their jobs in one statement.
        completing = (
            [] if records or self._complete_many_sql is None else [d for d in decisions if d.edge == "complete"]
        )
        if len({d.job.id for d in completing}) != len(completing):
            completing = []  # one job twice (never from a worker): one statement each, in order
        moved, inserted, claimed = self.backend.transact(
            lambda cur: self._finish_in(cur, worker, decisions, completing, now, records, claim, claim_bytes)
        )
        requeued = False
        log = events.enabled()
        for d, job in zip(decisions, moved, strict=True):
            if job is None:
                self._lost(d.job, worker)
                continue
            if log:
                self._event(d.edge, job if isinstance(job, JobRecord) else d.after(), worker, duration=d.duration)
            requeued = requeued or d.edge in ("retry", "release")
        self.committed(inserted)
        if requeued:
            self.wakeup.wake_local()
        return moved, self._claimed(claimed, worker)

    def _finish_in(
        self,
        cur: Any,
        worker: str,
        decisions: Sequence[Decision],
        completing: list[Decision],
        now: datetime,
        records: bool,
        claim: int,
        claim_bytes: int,
    ) -> tuple[list[Any], list[InsertResult], list[JobRecord]]:
        """The transaction of ``finish_and_claim``: (moved, follow-up jobs inserted, claimed)."""
        moved: list[Any] = []
        inserted: list[InsertResult] = []
        completed = self.complete_many(cur, worker, completing, now) if len(completing) > 1 else None
        for d in decisions:
            if completed is not None and d.edge == "complete":
                job: JobRecord | bool | None = True if (d.job.id, d.job.attempts) in completed else None
            else:
                values = dict(d.values)
                if d.edge in ("complete", "fail"):
                    values["now"] = d.finished_at or now
                job = self.transition(
                    cur, d.edge, d.job.id, worker=worker, attempt=d.job.attempts, returning=records, **values
                )
            moved.append(job)
            if job is not None and d.children:
                inserted.extend(self.insert_all(cur, d.children))
        for d, job in zip(decisions, moved, strict=True):
            if job is not None and d.edge == "defer":  # after the batch's releases: they wait too
                cur.execute(self.sql.DEFER_TYPE, {"type": d.job.type, "run_at": d.values["run_at"]})
        self.unblock_next(
            cur, [d.job for d, job in zip(decisions, moved, strict=True) if job is not None and d.edge in ENDING]
        )
        if inserted or any(d.edge in ("retry", "release", "defer", "snooze") for d in decisions):
            self.wakeup.notify_in(cur)
        claimed = self._claim_in(cur, worker, self.clock.now(), claim, claim_bytes) if claim else []
        return moved, inserted, claimed

    def unblock_next(self, cur: Any, ended: Iterable[JobRecord]) -> None:
        """After ``ended`` left the active set (in their transaction): on each of their targets,
        the oldest active job left is no longer blocked (``statements/sqlite.sql``, "the order per
        target"); the claim that follows in the same transaction can take it."""
        targets = sorted({job.ordering_key for job in ended if job.ordering_key is not None})
        if targets:
            cur.executemany(self.sql.UNBLOCK_NEXT, [{"ordering_key": target} for target in targets])

    def finish_one(self, worker: str, decision: Decision) -> JobRecord:
        """Record one outcome in its own transaction; LostLease if the job is no longer ours."""
        [moved] = self.finish(worker, [decision])
        if moved is None:
            raise LostLease(decision.job.id, worker, decision.job.attempts)
        assert isinstance(moved, JobRecord)  # finish() reads the changed rows back by default
        return moved

    def _lost(self, job: JobRecord, worker: str) -> None:
        events.emit("lost_lease", job_id=job.id, type=job.type, attempt=job.attempts, worker=worker)

    def heartbeat(self, worker: str, jobs: Sequence[JobRecord], *, now: datetime | None = None) -> list[str]:
        """Renew the locks of running ``jobs``; returns the ids this worker no longer holds."""
        if not jobs:
            return []

        def renew(cur: Any) -> list[str]:
            at = now or self.sync_clock(cur)
            lost = []
            for job in jobs:
                if (
                    cur.execute(
                        self.sql.HEARTBEAT, {"id": job.id, "worker": worker, "attempt": job.attempts, "now": at}
                    )
                    == 0
                ):
                    lost.append(job.id)
            return lost

        return self.backend.transact(renew)

    def sync_clock(self, cur: Any) -> datetime:
        """Now, as lock ages are measured. With the database's clock (``clock.DatabaseClock``)
        that is the database's own time, read in ``cur``'s transaction, which the clock then goes
        on from; otherwise the clock's time."""
        if isinstance(self.clock, DatabaseClock):
            return self.clock.sync(partial(cur.scalar, self.sql.DATABASE_TIME))
        return self.clock.now()

    def record_progress(self, job: JobRecord, worker: str, progress: str) -> bool:
        """Keep a running job's progress (JSON text); False if ``worker`` no longer holds it."""
        params = {"id": job.id, "worker": worker, "attempt": job.attempts, "progress": progress}
        return self.backend.transact(lambda cur: cur.execute(self.sql.PROGRESS, params)) == 1

    def holds(self, job: JobRecord, worker: str) -> bool:
        """Whether ``worker`` still holds ``job``'s current attempt (a read: no commit)."""
        return self.backend.ask(self.sql.HOLDS, {"id": job.id, "worker": worker, "attempt": job.attempts}) is not None

    def reclaim_stale(self, lock_timeout: float, *, now: datetime | None = None) -> list[JobRecord]:
        """Return claimed jobs whose lock is older than ``lock_timeout`` seconds to pending, or to
        failed if that was their last attempt; reclaim.py decides whose attempt counts."""
        moved = self.backend.transact(lambda cur: self._reclaim_in(cur, lock_timeout, now))
        for edge, job in moved:
            self._event(edge, job, None)
        if any(edge == "reclaim" for edge, _ in moved):
            self.wakeup.wake_local()
        self._unblock_lost_heads()
        return [job for edge, job in moved if edge == "reclaim"] + [job for edge, job in moved if edge != "reclaim"]

    def _reclaim_in(self, cur: Any, lock_timeout: float, now: datetime | None) -> list[tuple[str, JobRecord]]:
        """The transaction of ``reclaim_stale``: (edge, job) for each job it moved. Lock ages are
        measured by the time read in this transaction (``sync_clock``)."""
        now = now or self.sync_clock(cur)
        cutoff = now - timedelta(seconds=lock_timeout)
        moved: list[tuple[str, JobRecord]] = []
        for v in verdicts(cur.records(self.sql.STALE, {"cutoff": cutoff})):
            values: dict[str, Any] = {
                "attempts": v.attempts,
                "quarantine": v.quarantine,
                "error": v.error,
                "cutoff": cutoff,
            }
            if v.edge == "reclaim_exhausted":
                values["now"] = now
            job = self.transition(cur, v.edge, v.job.id, worker=v.job.locked_by, attempt=v.job.attempts, **values)
            if job is None:  # renewed since it was read (PostgreSQL: a heartbeat got in first)
                continue
            assert isinstance(job, JobRecord)
            moved.append((v.edge, job))
            if v.acquit is not None:
                cur.execute(self.sql.ACQUIT, {"quarantine": v.acquit, "acquitted": SUSPECT})
        self.unblock_next(cur, [job for edge, job in moved if edge in ENDING])
        if any(edge == "reclaim" for edge, _ in moved):
            self.wakeup.notify_in(cur)
        return moved

    def _unblock_lost_heads(self) -> None:
        """The sweep's safety net: unblock each target's oldest active job left blocked (see
        self.sql.LOST_HEADS); normally there is none, and only a read is made."""
        with self.backend.read() as cur:
            if cur.scalar(self.sql.ANY_BLOCKED) is None:
                return
            lost = [job_id for (job_id,) in cur.rows(self.sql.LOST_HEADS)]
        if not lost:
            return
        unblocked = self.backend.transact(lambda cur: self._unblock_heads_in(cur, lost))
        if unblocked:
            events.emit("unblocked", jobs=unblocked)
            self.wakeup.wake_local()

    def _unblock_heads_in(self, cur: Any, heads: list[str]) -> int:
        unblocked: int = sum(cur.execute(self.sql.UNBLOCK_HEAD, {"id": job_id}) for job_id in heads)
        if unblocked:
            self.wakeup.notify_in(cur)
        return unblocked

    def manual_retry(self, job_id: str) -> JobRecord:
        """Operator action: a failed job goes back to pending with its attempts reset."""
        now = self.clock.now()
        try:
            moved = self.backend.transact(lambda cur: self._manual_retry_in(cur, job_id, now))
        except sa.exc.IntegrityError as e:
            job = self.get(job_id)
            other = self._active_with_key(job)
            raise DuplicateActiveJob(job_id, other.id if other else "?", job.idempotency_key or "") from e
        self._event("manual_retry", moved, None)
        self.wakeup.wake_local()
        return moved

    def _manual_retry_in(self, cur: Any, job_id: str, now: datetime) -> JobRecord:
        # Read once: the write lock (BEGIN IMMEDIATE / the row's guard) keeps it current.
        failed = self.get(job_id, cur=cur)
        if failed.status is not JobStatus.FAILED:
            raise InvalidTransition(job_id, failed.status.value, JobStatus.PENDING.value)
        if failed.ordering_key is not None:
            newer = cur.scalar(self.sql.NEWER_ON_TARGET, {"ordering_key": failed.ordering_key, "id": job_id})
            if newer is not None:
                raise Superseded(job_id, newer, display(failed.ordering_key))
        moved = self.transition(cur, "manual_retry", job_id, now=now)
        if moved is None:  # PostgreSQL: changed by another transaction since the read
            raise InvalidTransition(job_id, self.get(job_id, cur=cur).status.value, JobStatus.PENDING.value)
        assert isinstance(moved, JobRecord)  # returning=True: the changed row, read back
        self.wakeup.notify_in(cur)
        return moved

    def _active_with_key(self, job: JobRecord) -> JobRecord | None:
        with self.backend.read() as cur:
            return cur.record(self.sql.ACTIVE_BY_KEY, {"type": job.type, "idempotency_key": job.idempotency_key})

    def get(self, job_id: str, *, cur: Any = None) -> JobRecord:
        if cur is None:
            with self.backend.read() as c:
                job = c.record(self.sql.GET, {"id": job_id})
        else:
            job = cur.record(self.sql.GET, {"id": job_id})
        if job is None:
            raise JobNotFound(job_id)
        return job

    def _event(self, edge: str, job: JobRecord, worker: str | None, *, duration: float | None = None) -> None:
        events.emit(
            _EDGE_EVENT[edge],
            job_id=job.id,
            type=job.type,
            attempt=job.attempts,
            worker=worker,
            duration_ms=None if duration is None else round(duration * 1000, 3),
            run_at=job.run_at.isoformat() if edge == "retry" else None,
            error=(job.last_error or "").split("\n", 1)[0][:200]
            if edge in ("retry", "fail", "reclaim", "reclaim_exhausted")
            else None,
        )
