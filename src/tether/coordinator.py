"""The entry point applications hold: one ledger, one data root, one clock."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from . import config, events, tracing
from .clock import Clock
from .jobtypes import JobType, Payload, Registry, default_registry
from .ledger import cancel as cancelling
from .ledger import conflict, corrected, meta, pausing
from .ledger.engine import Durability, create_engine
from .ledger.notes import Note, notes_for
from .ledger.queue import Queue
from .ledger.record import InsertResult, JobRecord
from .ledger.wakeup import wakeup_for
from .opening import channel_of, ledger_clock, prepare_root
from .transaction import Transaction

if TYPE_CHECKING:
    # Imported where used: an application opens a coordinator to enqueue, often at start-up (a
    # CLI ``tether enqueue`` every time), and these are slow to import (benchmarks/README.md).
    from sqlalchemy.orm import Session

    from .observe.backlog import Stats
    from .observe.history import History
    from .observe.retention import PurgeResult
    from .observe.verdict import Health, Thresholds
    from .reconcile.check import Report
    from .reconcile.plan import Plan
    from .worker.loop import Worker
    from .worker.schedule import Scheduler

_SESSION_KEY = "tether.enqueued"


class Coordinator:
    """``Coordinator.open(db_url, root=...)``, then ``enqueue`` jobs and run a ``worker``."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        root: Path,
        clock: Clock,
        registry: Registry,
        lock_timeout: float,
        ledger_id: str,
        max_payload_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.engine = engine
        self.ledger_id = ledger_id
        """The id the ledger got when it was created (``$TETHER_LEDGER_ID`` overrides it): what the
        AWS resources its jobs own are tagged with; it survives moving the ledger or its host."""
        self.root = root
        self.clock = clock
        self.registry = registry
        self.lock_timeout = lock_timeout
        self.queue = Queue(
            engine,
            clock=clock,
            registry=registry,
            root=root,
            wakeup=wakeup_for(engine, channel_of(engine)),
            ledger_id=config.ledger_id() or ledger_id,
            max_payload_bytes=max_payload_bytes,
        )
        self._scheduler: Scheduler | None = None
        self._scheduler_lock = threading.Lock()

    @property
    def scheduler(self) -> Scheduler:
        """The schedules this coordinator declared, which its workers fire (made on first use:
        see the imports)."""
        with self._scheduler_lock:  # one per coordinator, whichever thread asks first
            if self._scheduler is None:
                from .worker.schedule import Scheduler

                self._scheduler = Scheduler(self.engine, self.queue)
            return self._scheduler

    @classmethod
    def open(
        cls,
        db_url: str | None = None,
        *,
        root: str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
        durability: Durability | None = None,
        lock_timeout: float = config.DEFAULT_LOCK_TIMEOUT,
        registry: Registry | None = None,
        schema: str | None = None,
        moved: bool = False,
        max_payload_bytes: int | None = None,
        create: bool = True,
    ) -> Coordinator:
        """Open the ledger at ``db_url`` (default ``$TETHER_DB`` or ``sqlite:///tether.db``) for
        the data root ``root`` (default ``$TETHER_ROOT`` or ``.``), creating it if there is none:
        an application opening its own ledger at start-up is the normal way one comes to be.
        ``create=False`` raises NoLedger instead, as the command line does, where a mistyped
        ``--db`` must not become a new, empty ledger that no worker serves.
        ``durability`` (default ``$TETHER_DURABILITY`` or ``"full"``): ``"normal"`` trades the
        last commits on power loss (never on a process crash) for speed, on SQLite. ``schema``
        (default ``$TETHER_SCHEMA``; PostgreSQL only) keeps the ledger in its own schema of a
        database shared with other applications.

        The ledger records the data root it was created for: without ``root`` (and
        ``$TETHER_ROOT``) that one is used, and a different one is refused (``meta.RootMismatch``)
        unless ``moved`` records it as the new root. Only a new ledger creates its root. ``max_payload_bytes``
        (default ``$TETHER_MAX_PAYLOAD_BYTES`` or 16 MiB): the largest payload (its stored JSON)
        enqueue accepts. ``clock``: which one a ledger reads is ``opening.ledger_clock``'s choice."""
        max_payload_bytes = config.max_payload_bytes(max_payload_bytes)
        db_url = config.db_url(db_url)
        engine = create_engine(
            db_url,
            durability=config.durability(durability),  # type: ignore[arg-type]  # create_engine checks the value
            schema=config.schema(schema),
            create=create,
        )
        given = config.named_root(root)
        try:
            root_path, ledger_id, first = meta.ready(engine, given, moved=moved, create=create)
            prepare_root(root_path, create=first)
            clock = ledger_clock(engine, clock)
        except BaseException:
            engine.dispose()
            raise
        return cls(
            engine,
            root=root_path,
            clock=clock,
            registry=registry or default_registry(),
            lock_timeout=lock_timeout,
            ledger_id=config.ledger_id() or ledger_id,
            max_payload_bytes=max_payload_bytes,
        )

    def register(self, job_type: JobType[Any]) -> JobType[Any]:
        """Add an application's own job type."""
        return self.registry.register(job_type)

    # -- enqueue -----------------------------------------------------------------------------

    @tracing.traced_enqueue
    def enqueue(
        self,
        payload: Payload,
        *,
        priority: int = 0,
        max_attempts: int = 3,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        key: str | None = None,
        timeout: float | None = None,
        tags: Sequence[str] | None = None,
        meta: Mapping[str, Any] | None = None,
        session: Session | None = None,
    ) -> InsertResult:
        """Record a job. Returns once the job is durably committed (in a commit shared with the
        enqueues other threads of this process make meanwhile), or, with an application
        ``session``, inside that session's transaction (it commits with the caller's rows only).
        If an active job of the same type has the same idempotency ``key``, that job is returned
        with ``duplicate=True``. ``timeout`` (seconds) overrides the job type's for this job. ``tags``
        and ``meta`` go with it (``tether.ledger.notes``). Raises InvalidPayload for bad input."""
        enqueuer = self.queue.enqueuer
        jobs = enqueuer.builder.build(
            [payload],
            priority=priority,
            max_attempts=max_attempts,
            delay=delay,
            run_at=run_at,
            key=key,
            timeout=timeout,
        )
        notes = None if tags is None and meta is None else notes_for(jobs, tags, meta)
        if session is not None:
            return self._in_session(session, jobs, notes)[0]
        return enqueuer.enqueue(jobs, notes)[0]

    @tracing.traced_enqueue
    def enqueue_many(
        self,
        payloads: Sequence[Payload],
        *,
        tags: Sequence[str] | None = None,
        meta: Mapping[str, Any] | None = None,
        session: Session | None = None,
        **options: Any,
    ) -> list[InsertResult]:
        """Several jobs in one transaction: all are recorded or none. They share one enqueue
        time (ids keep their order), and ``tags`` and ``meta`` if given."""
        jobs = self.queue.enqueuer.build(payloads, **options)
        notes = notes_for(jobs, tags, meta)
        if session is not None:
            return self._in_session(session, jobs, notes)
        return self.queue.enqueuer.enqueue(jobs, notes)

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """``with coordinator.transaction() as tx: tx.enqueue(...)``: commits all at the end, in a
        transaction of their own (never shared with other threads' enqueues)."""
        tx = Transaction(self)
        yield tx
        tx.results = self.queue.enqueuer.enqueue(tx.jobs, tx.notes, shared=False)

    def _in_session(self, session: Session, jobs: list[JobRecord], notes: dict[str, Note] | None) -> list[InsertResult]:
        try:
            with self.queue.backend.write(session.connection()) as cur:
                results = self.queue.enqueuer.insert_all(cur, jobs, notes)
                self.queue.wakeup.notify_in(cur)  # delivered only if the application commits
        except sa.exc.DBAPIError as e:
            # The transaction is the application's: only it can run the whole of it again.
            if conflict.is_conflict(e):
                raise conflict.in_session(e) from e
            raise
        if not sa.event.contains(session, "after_commit", self._session_committed):
            # Once per session and coordinator: its commits report the jobs they made real (to
            # this coordinator's events and idle workers), rollbacks forget them.
            sa.event.listen(session, "after_commit", self._session_committed)
            sa.event.listen(session, "after_rollback", self._session_rolled_back)
        session.info.setdefault((_SESSION_KEY, self), []).extend(results)
        return results

    def _session_committed(self, session: Session) -> None:
        self.queue.enqueuer.committed(session.info.pop((_SESSION_KEY, self), []))

    def _session_rolled_back(self, session: Session) -> None:
        session.info.pop((_SESSION_KEY, self), None)  # those jobs never existed

    def schedule(
        self,
        name: str,
        cron: str,
        payload: Payload,
        *,
        timezone: str = "UTC",
        start: datetime | None = None,
        end: datetime | None = None,
        limit: int | None = None,
        catch_up: str = "latest",
        **options: Any,
    ) -> None:
        """Enqueue ``payload`` at every slot of ``cron`` (five fields, or six with seconds
        first) in ``timezone``, from ``start`` to ``end``, at most ``limit`` times, each slot
        exactly once across every worker of this ledger (see ``tether.worker.schedule``). Workers of
        this coordinator fire it; ``catch_up`` ("latest", "all" or "none") says what to do with
        slots missed while no worker ran. ``options`` (priority, max_attempts, timeout) apply
        to every run. Raises InvalidSchedule or InvalidPayload, recording nothing."""
        from .worker import schedule as schedules
        from .worker.cron import InvalidSchedule

        schedules.validate(name, cron, timezone, start, end, limit, catch_up)
        allowed = {"priority", "max_attempts", "timeout"}
        if set(options) - allowed:
            raise InvalidSchedule(
                f"schedule {name}: unknown option(s) {', '.join(sorted(set(options) - allowed))}; "
                f"use {', '.join(sorted(allowed))}"
            )
        job = self.queue.build(payload, **options)  # bad payloads fail here, not at 3 a.m.
        spec = schedules.Spec(
            name, cron, payload, timezone, start, end, limit, catch_up, job.type, tuple(sorted(options.items()))
        )
        self.scheduler.add(spec, self.clock.now())

    # -- running -----------------------------------------------------------------------------

    def worker(self, **config: Any) -> Worker:
        """A worker for this ledger; keyword arguments are WorkerConfig fields."""
        from .worker.loop import Worker, WorkerConfig

        config.setdefault("lock_timeout", self.lock_timeout)
        return Worker(self.queue, WorkerConfig(**config), scheduler=self.scheduler)

    def run_until_idle(self, **config: Any) -> int:
        """Run every ready job in this process, then return how many ran."""
        return self.worker(**config).run_until_idle()

    # -- operator actions and reads --------------------------------------------------------------

    def get(self, job_id: str) -> JobRecord:
        return self.queue.get(job_id)

    def retry(self, job_id: str, payload: Payload | None = None) -> JobRecord:
        """Put a failed job back to pending with its attempts reset (explicit operator action);
        with a corrected ``payload``, a new job linked to it instead (``tether.ledger.corrected``)."""
        if payload is None:
            return self.queue.manual_retry(job_id)
        return corrected.retry_with(self.queue, job_id, payload)

    def cancel(self, *job_ids: str, **options: Any) -> list[cancelling.CancelResult]:
        """Cancel jobs by id, or every active job of ``job_type``, idempotency ``key``, ``tag``: a
        pending one at once, a running one by its worker within a second, with the verdict on its
        effect; a finished one is refused. Options: ``reason``, ``wait`` (see ledger/cancel.py)."""
        return cancelling.cancel(self.queue, job_ids, **options)

    def pause(self, job_type: str, reason: str | None = None) -> pausing.Pause:
        """Stop every worker claiming ``job_type`` (within a second); its running jobs finish."""
        return pausing.pause(self.queue, job_type, reason)

    def resume(self, job_type: str) -> bool:
        """Let workers claim ``job_type`` again; False if it was not paused."""
        return pausing.resume(self.queue, job_type)

    def reclaim_stale(self, *, now: datetime | None = None) -> list[JobRecord]:
        return self.queue.reclaim_stale(self.lock_timeout, now=now)

    def startup_check(self, **options: Any) -> Report:
        """Run before workers start: reclaim stale locks (so their paths show as in flight, not
        drift), reconcile the ledger with the data root, log the result and return the
        ``reconcile.Report`` (``report.exit_code``: 0 in sync, 2 drift, 1 could not check).
        Keyword arguments go to ``reconcile.reconcile`` (``content``, ``full``, ``untracked``)."""
        from .reconcile.check import reconcile

        reclaimed = self.reclaim_stale()
        report = reconcile(self, **options)
        events.emit("startup_check", reclaimed=len(reclaimed), **report.summary())
        return report

    def plan_repairs(self, report: Report | None = None, **options: Any) -> Plan:
        """Per finding of ``report`` (else a new check with ``options``) the job that restores the
        ledger's state, or why none can; changes nothing (see ``tether.reconcile.plan``)."""
        from .reconcile.plan import plan_repairs

        return plan_repairs(self, report, **options)

    def apply_repairs(self, plan: Plan, *, only: Sequence[str] = ()) -> list[InsertResult]:
        """Enqueue an approved plan's jobs (``only``: those targets') in one transaction, or raise
        ``StalePlan`` and enqueue nothing if a planned target has had a job since."""
        from .reconcile.repair import apply_plan

        return apply_plan(self, plan, only)

    def accept(self, targets: Sequence[str], *, reason: str | None = None, by: str | None = None) -> list[JobRecord]:
        """Record what each target holds now as its expected state: one completed ``adopt`` job
        each, naming ``by`` (default: the user) and ``reason`` (see ``tether.reconcile.accept``)."""
        from .reconcile.accept import accept

        return accept(self, targets, reason=reason, by=by)

    def stats(self, **options: Any) -> Stats:
        """Outstanding, failed, stuck and oldest pending, by type (see ``tether.observe.health.stats``)."""
        from .observe.health import stats

        return stats(self, **options)

    def health(self, thresholds: Thresholds | None = None) -> Health:
        """The ok / warning / error verdict of ``tether status`` (see ``tether.observe.health``)."""
        from .observe.health import health

        return health(self, thresholds)

    def history(self, target: str, *, limit: int | None = 50) -> History:
        """Every job that touched ``target`` (a data path, an AWS resource, a stored ordering key)
        and every attempt of each, in time order (see ``tether.observe.history``)."""
        from .observe.history import history

        return history(self, target, limit=limit)

    def purge(
        self, *, older_than: timedelta, statuses: Sequence[str] = ("completed",), dry_run: bool = False
    ) -> PurgeResult:
        """Delete finished jobs older than ``older_than`` and their attempts (keeping what reconcile
        and history need: each target's latest completed job)."""
        from .observe.retention import purge

        return purge(self, older_than=older_than, statuses=statuses, dry_run=dry_run)

    def close(self) -> None:
        self.queue.wakeup.close()
        self.queue.backend.close()
        self.engine.dispose()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
