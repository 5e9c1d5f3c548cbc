"""Claiming and every status change of a job, each through one guarded function (``transition``).

New jobs go in through ``Queue.enqueuer`` (enqueue.py): the queue holds it because a completing
job's follow-up jobs are inserted in the transaction that records its outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

from .. import events
from ..clock import Clock
from ..config import DEFAULT_BATCH_BYTES
from ..errors import AlreadyRetried, DuplicateActiveJob, InvalidTransition, JobNotFound, Superseded
from ..jobtypes import Payload, Registry
from ..jobtypes.target import display
from . import attempts, drivers, reclaim
from .backend import Answer
from .build import Builder
from .catalogue import Statements
from .claim import Claimer
from .engine import ledger_name
from .enqueue import Enqueuer
from .lifecycle import EDGES, ENDING, FENCED, SWEPT, Decision
from .limits import DEFAULT_MAX_PAYLOAD_BYTES
from .record import InsertResult, JobRecord
from .status import JobStatus
from .wakeup import Wakeup

UNSERVED_LOOK = 100
"""Waiting jobs at the head of the queue that ``Queue.pending_unserved`` looks at: a batch's worth."""

_EDGE_SQL = {  # each edge's statement, by its name in the catalogue
    "complete": "COMPLETE",
    "retry": "RETRY",
    "fail": "FAIL",
    "cancel_running": "CANCEL_RUNNING",
    "cancel": "CANCEL",
    "release": "RELEASE",
    "defer": "DEFER",
    "snooze": "DEFER",  # the same row change, without holding back the type's other jobs
    "manual_retry": "MANUAL_RETRY",
    "reclaim": "RECLAIM",
    "reclaim_exhausted": "RECLAIM_EXHAUSTED",
}


class Queue:
    """The ledger as a worker drives it: claim, record outcomes, renew leases, sweep stale locks."""

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
        self.ledger_id = ledger_id  # what the AWS resources its jobs own are tagged with
        self.where = ledger_name(engine)  # the ledger as messages name it
        self.backend = drivers.for_engine(engine)
        self.sql: Statements = self.backend.sql  # the statement catalogue of this ledger's dialect
        builder = Builder(registry, root, clock, max_payload_bytes=max_payload_bytes)
        self.enqueuer = Enqueuer(self.backend, builder, wakeup, self.where)
        self.claimer = Claimer(registry, self.sql)
        self._complete_many_sql = self.sql.COMPLETE_MANY if self.backend.reads_json else None
        self._edge_sql = {edge: getattr(self.sql, name) for edge, name in _EDGE_SQL.items()}
        # The worker's edges as its group commits record them: the same row change, no row read back.
        self._edge_sql_no_return = {
            edge: getattr(self.sql, f"{name}_NO_RETURN") for edge, name in _EDGE_SQL.items() if edge in FENCED
        }

    @property
    def wakeup(self) -> Wakeup:
        """The enqueuer's: one for both halves, so a process that swaps it swaps it for both."""
        return self.enqueuer.wakeup

    @wakeup.setter
    def wakeup(self, wakeup: Wakeup) -> None:
        self.enqueuer.wakeup = wakeup

    def build(self, payload: Payload, **options: Any) -> JobRecord:
        """One job, validated before a transaction opens (a handler's follow-up job:
        ``jobtypes.context.Services``); raises InvalidPayload. Options as ``build.Builder.build``."""
        return self.enqueuer.build([payload], **options)[0]

    def claim(
        self, worker: str, *, now: datetime | None = None, limit: int = 1, max_bytes: int = DEFAULT_BATCH_BYTES
    ) -> list[JobRecord]:
        """Atomically take up to ``limit`` ready jobs: highest priority first, then oldest, with at
        most ``max_bytes`` of payload between them, or one larger job (claim.py)."""
        now = now or self.clock.now()
        answers = self.backend.transact(
            lambda cur: self.claimer.claim_in(cur, worker, now, limit, max_bytes), pipelined=True
        )
        return self._claimed(self.claimer.claimed(self.backend, answers), worker)

    def pending_unserved(self, *, cur: Any = None) -> dict[str, int]:
        """Pending jobs of the types this queue's registry lacks, counted by type: jobs that a
        worker on it never claims (a worker started without the module that registers them).
        The types are those among the first ``UNSERVED_LOOK`` waiting jobs in claim order
        (WAITING_TYPES says why that head is enough), so the read costs the same however many
        jobs wait; only a type found there is counted, exactly. In ``cur``'s transaction if given."""
        if cur is None:
            with self.backend.read() as c:
                return self.pending_unserved(cur=c)
        lacking = {t for (t,) in cur.rows(self.sql.WAITING_TYPES, {"limit": UNSERVED_LOOK})}
        lacking.difference_update(self.registry.names())
        if not lacking:
            return {}
        return dict(cur.rows(self.sql.PENDING_OF_TYPES, {"types": self.sql.types(lacking)}))

    def _claimed(self, rows: list[JobRecord], worker: str) -> list[JobRecord]:
        jobs = sorted(rows, key=lambda j: (-j.priority, j.created_at, j.id))
        if events.enabled():
            for job in jobs:
                self.emit_edge("claim", job, worker)
        return jobs

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
        row is a visible share of a no-op job's CPU."""
        from_status, to_status = EDGES[edge][:2]
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

    def complete_many(self, cur: Any, worker: str, decisions: Sequence[Decision], now: datetime) -> Completed:
        """``transition(cur, "complete", ...)`` for several of ``worker``'s jobs (distinct ids) in
        one statement, each fenced exactly as ``transition`` fences it; the answer says which
        moved: the others lost their lease."""
        time = self.backend.time
        rows = {d.job.id: (d.job.attempts, time(d.finished_at or now), d.values["result"]) for d in decisions}
        if len(rows) != len(decisions):
            raise ValueError("complete_many: each job once")
        return Completed(cur.later(self._complete_many_sql, {"worker": worker, "rows": orjson.dumps(rows).decode()}))

    def finish_and_claim(
        self,
        worker: str,
        decisions: Sequence[Decision],
        *,
        records: bool = True,
        claim: int = 0,
        claim_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> tuple[list[Any], list[JobRecord]]:
        """Record the outcomes of several of ``worker``'s jobs in one transaction (a group
        commit), then in the same transaction claim up to ``claim`` next jobs (holding at most
        ``claim_bytes`` of payload, or one job): a draining worker pays one durable commit per
        batch instead of two; a crash before the commit undoes both.

        Each outcome is fenced on its own: where the lease was lost the entry is None, a
        ``lost_lease`` event is logged, and the others still apply. Follow-up jobs are inserted
        only for jobs that completed. Entries are the changed rows, or with ``records=False``
        True. Returns (entries, claimed jobs)."""
        now = self.clock.now()
        # The worker's group commits (records=False) complete their jobs in one statement.
        completing = (
            [] if records or self._complete_many_sql is None else [d for d in decisions if d.edge == "complete"]
        )
        if len({d.job.id for d in completing}) != len(completing):
            completing = []  # one job twice (never from a worker): one statement each, in order
        moved, inserted, answers = self.backend.transact(
            lambda cur: self._finish_in(cur, worker, decisions, completing, now, records, claim, claim_bytes),
            pipelined=True,
        )
        moved = [
            job.moved(d.job) if isinstance(job, Completed) else job for d, job in zip(decisions, moved, strict=True)
        ]
        claimed = self.claimer.claimed(self.backend, answers)
        requeued = False
        log = events.enabled()
        for d, job in zip(decisions, moved, strict=True):
            if job is None:
                self.emit_lost(d.job, worker)
                continue
            if log:
                self.emit_edge(d.edge, job if isinstance(job, JobRecord) else d.after(), worker, duration=d.duration)
            requeued = requeued or d.edge in ("retry", "release")
        self.enqueuer.committed(inserted)
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
    ) -> tuple[list[Any], list[InsertResult], list[Answer]]:
        """The transaction of ``finish_and_claim``: (moved, follow-up jobs inserted, the claim's
        answers). Whether a job of ``completing`` moved is read from its statement's answer once the
        transaction has committed (its entry is the ``Completed``), unless its follow-ups need it
        in the transaction: the worker's transaction then waits for no answer."""
        moved: list[Any] = []
        inserted: list[InsertResult] = []
        completed = self.complete_many(cur, worker, completing, now) if len(completing) > 1 else None
        for d in decisions:
            if completed is not None and d.edge == "complete":
                job: JobRecord | bool | Completed | None = completed.moved(d.job) if d.children else completed
            else:
                values = dict(d.values)
                if d.edge in ("complete", "fail", "cancel_running"):
                    values["now"] = d.finished_at or now
                job = self.transition(
                    cur, d.edge, d.job.id, worker=worker, attempt=d.job.attempts, returning=records, **values
                )
            moved.append(job)
            if job is not None and d.children:
                inserted.extend(self.enqueuer.insert_all(cur, d.children))
        ended: list[dict[str, Any]] = []  # the attempt rows of the jobs that moved but did not complete
        for d, job in zip(decisions, moved, strict=True):
            if job is None or d.edge == "complete":
                continue
            if d.edge == "defer":  # after the batch's releases: they wait too
                cur.send(self.sql.DEFER_TYPE, {"type": d.job.type, "run_at": d.values["run_at"]})
            outcome = d.attempt
            if outcome is not None:
                values = {"error": d.values.get("error"), "traceparent": d.traceparent}
                ended.append(attempts.row(d.job, outcome, d.finished_at or now, worker=worker, **values))
        if ended:
            cur.executemany(self.sql.INSERT_ATTEMPT, ended)
        # A Completed entry counts as moved: where its job did not move, the target's oldest
        # active job is that job or one before it, which nothing blocks (UNBLOCK_NEXT leaves it).
        self.unblock_next(
            cur, [d.job for d, job in zip(decisions, moved, strict=True) if job is not None and d.edge in ENDING]
        )
        if inserted or not {d.edge for d in decisions}.isdisjoint(("retry", "release", "defer", "snooze")):
            self.wakeup.notify_in(cur)
        answers = self.claimer.claim_in(cur, worker, self.clock.now(), claim, claim_bytes) if claim else []
        return moved, inserted, answers

    def unblock_next(self, cur: Any, ended: Iterable[JobRecord]) -> None:
        """After ``ended`` left the active set (in their transaction): on each of their targets,
        the oldest active job left is no longer blocked (``statements/sqlite.sql``, "the order per target"); the
        claim that follows in the same transaction can take it."""
        targets = sorted({job.ordering_key for job in ended if job.ordering_key is not None})
        # Only a pending job is ever blocked (every claim takes unblocked ones): with none, no
        # target has a job to unblock, and one entry of the claim index (ANY_BLOCKED) answers for
        # a statement per target. For one target that entry costs what its statement does, and
        # a target's backlog is blocked behind it: the statement runs unasked. PostgreSQL: a job
        # inserted behind one of ``ended`` share-locked it, so the update that ended it waited
        # for that insert to commit, and this read, after it, sees the job
        # (statements/postgresql.sql).
        if not targets:
            return
        if len(targets) == 1 or cur.scalar(self.sql.ANY_BLOCKED) is not None:
            cur.executemany(self.sql.UNBLOCK_NEXT, [{"ordering_key": target} for target in targets])

    def heartbeat(self, worker: str, jobs: Sequence[JobRecord], *, now: datetime | None = None) -> list[str]:
        """Renew the locks of running ``jobs``; returns the ids this worker no longer holds. The
        caller logs the losses (``emit_lost``): only it knows which of them an outcome recorded
        meanwhile ended, rather than another worker taking them."""
        return reclaim.renew(self, worker, jobs, now)

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
        return reclaim.sweep(self, lock_timeout, now)

    def manual_retry(self, job_id: str) -> JobRecord:
        """Operator action: a failed job goes back to pending with its attempts reset."""
        now = self.clock.now()
        try:
            moved = self.backend.transact(lambda cur: self._manual_retry_in(cur, job_id, now))
        except sa.exc.IntegrityError as e:
            job = self.get(job_id)
            other = self.enqueuer.active_with_key(job)
            raise DuplicateActiveJob(job_id, other.id if other else "?", job.idempotency_key or "") from e
        self.emit_edge("manual_retry", moved, None)
        self.wakeup.wake_local()
        return moved

    def _manual_retry_in(self, cur: Any, job_id: str, now: datetime) -> JobRecord:
        # Read once: the write lock (BEGIN IMMEDIATE / the row's guard) keeps it current.
        failed = self.get(job_id, cur=cur)
        if failed.status is not JobStatus.FAILED:
            raise InvalidTransition(job_id, failed.status.value, JobStatus.PENDING.value)
        corrected = cur.scalar(self.sql.RETRIED_AS, {"id": job_id})
        if corrected is not None:  # running the bad payload again would do the work twice
            raise AlreadyRetried(job_id, corrected)
        if failed.ordering_key is not None:
            newer = cur.scalar(self.sql.NEWER_ON_TARGET, {"ordering_key": failed.ordering_key, "id": job_id})
            if newer is not None:
                raise Superseded(job_id, newer, display(failed.ordering_key))
        moved = self.transition(cur, "manual_retry", job_id, now=now)
        if moved is None:  # PostgreSQL: changed by another transaction since the read
            raise InvalidTransition(job_id, self.get(job_id, cur=cur).status.value, JobStatus.PENDING.value)
        cur.execute(
            self.sql.INSERT_ATTEMPT,
            attempts.row(failed, attempts.Outcome.MANUAL_RETRY, now, worker=None, started_at=now),
        )
        assert isinstance(moved, JobRecord)  # returning=True: the changed row, read back
        self.wakeup.notify_in(cur)
        return moved

    def get(self, job_id: str, *, cur: Any = None) -> JobRecord:
        if cur is None:
            with self.backend.read() as c:
                return self.get(job_id, cur=c)
        job: JobRecord | None = cur.record(self.sql.GET, {"id": job_id})
        if job is None:
            raise JobNotFound(job_id)
        return job

    def previous_attempt_trace(self, job_id: str) -> str | None:
        """The ``traceparent`` of the job's latest traced attempt that did not complete it."""
        with self.backend.read() as cur:
            value: str | None = cur.scalar(self.sql.ATTEMPT_TRACE, {"job_id": job_id})
            return value

    def emit_lost(self, job: JobRecord, worker: str) -> None:
        """Log that ``worker``'s outcome for ``job`` was not recorded: its lease was lost."""
        events.emit("lost_lease", job_id=job.id, type=job.type, attempt=job.attempts, worker=worker)

    def emit_edge(self, edge: str, job: JobRecord, worker: str | None, *, duration: float | None = None) -> None:
        """Log the event of ``edge`` for ``job`` as the edge left it."""
        events.emit(
            EDGES[edge].event,
            job_id=job.id,
            type=job.type,
            attempt=job.attempts,
            worker=worker,
            duration_ms=None if duration is None else round(duration * 1000, 3),
            run_at=job.run_at.isoformat() if edge in ("retry", "snooze", "defer") else None,
            snoozes=job.snoozes if edge in ("snooze", "defer") else None,
            error=(job.last_error or "").split("\n", 1)[0][:200]
            if edge in ("retry", "fail", "reclaim", "reclaim_exhausted")
            else None,
        )


class Completed:
    """Which jobs COMPLETE_MANY moved (``Queue.complete_many``), read from its answer when first
    asked for."""

    __slots__ = ("_answer", "_moved")

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._moved: set[tuple[str, int]] | None = None

    def moved(self, job: JobRecord) -> bool | None:
        """True if ``job`` moved, None if it lost its lease (as ``Queue.transition``)."""
        if self._moved is None:
            self._moved = {(job_id, attempts) for job_id, attempts in self._answer.rows()}
        return True if (job.id, job.attempts) in self._moved else None
