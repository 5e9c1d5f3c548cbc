"""The claim inside a write transaction: which statement takes jobs, and how much it may take.

``Claimer.claim_in`` runs in the caller's transaction (``queue.Queue.claim`` opens one of its
own; ``finish_and_claim`` shares the one that records a batch's outcomes). It takes ready jobs
highest priority first, then oldest, within a byte budget (CLAIM in ``statements/sqlite.sql``: a job larger than the
batch's share waits for the claim it leads), each registered type with a ``max_running`` limit
only up to its room, leaves out the types an operator paused (pausing.py), and gives each claim
of a worker a time of its own. What it took is read once the transaction has committed
(``Claimer.claimed``): a pipelined transaction (``Backend.transact``) waits for no answer.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

from ..jobtypes import Registry
from .backend import Answer, Backend
from .catalogue import Statements
from .pausing import PausedTypes
from .record import JobRecord


class Claimer:
    """Claims for one engine and registry; the statements are made again only when a type is
    registered."""

    def __init__(self, registry: Registry, statements: Statements) -> None:
        self.registry = registry
        self.sql = statements
        self._claim_types: tuple[tuple[int, frozenset[str]], Any] = ((-1, frozenset()), None)  # see _claimed_types
        self.paused = PausedTypes(statements.PAUSED_TYPES)
        self._limits: dict[str, int] = {}
        self._limits_generation = -1
        self._last_claim_at: dict[str, datetime] = {}  # by worker id
        self._claim_time_lock = threading.Lock()

    def claim_in(self, cur: Any, worker: str, now: datetime, limit: int, max_bytes: int) -> list[Answer]:
        """Take up to ``limit`` ready jobs for ``worker`` in ``cur``'s transaction, holding at most
        ``max_bytes`` of payload between them (or one larger job); the jobs are the answers'
        (``claimed``), read once the transaction has committed: nothing in it waits for them."""
        now = self._claim_time(worker, now)
        if self.sql.CLAIM_PLAN:  # for every CLAIM of this transaction, limited types' too
            cur.send(self.sql.CLAIM_PLAN)
        paused = self.paused.current(cur)
        limited = self._limited()
        if limited:
            return self._claim_limited(cur, worker, now, limit, max_bytes, limited, paused)
        types = self._claimed_types(paused)
        params = {"worker": worker, "now": now, "limit": limit, "max_bytes": max_bytes, "types": types}
        return [cur.later(self.sql.CLAIM, params)]

    def claimed(self, backend: Backend, answers: list[Answer]) -> list[JobRecord]:
        """The jobs of ``claim_in``'s committed answers, each with its payload: those the claim
        left out (over ``catalogue.INLINE_PAYLOAD`` bytes) read now, each by its own statement,
        so one is in flight at a time. They are this worker's already, and a claimed job's
        payload does not change."""
        return [
            job if job.payload is not None else job._replace(payload=backend.ask(self.sql.PAYLOAD, {"id": job.id}))
            for answer in answers
            for job in answer.records()
        ]

    def _claimed_types(self, paused: frozenset[str]) -> Any:
        """CLAIM's ``types``: this registry's types less the paused ones, bound again only when
        a type is registered, paused or resumed."""
        made_for, types = self._claim_types
        if made_for != (self.registry.generation, paused):
            types = self.sql.types(name for name in self.registry.names() if name not in paused)
            self._claim_types = ((self.registry.generation, paused), types)
        return types

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
        self,
        cur: Any,
        worker: str,
        now: datetime,
        limit: int,
        max_bytes: int,
        limited: dict[str, int],
        paused: frozenset[str],
    ) -> list[Answer]:
        """The claim, with each limited type taken only up to its room: ``max_running`` minus its
        jobs claimed now, across every worker (counted in the claiming transaction). The byte cap
        spans the statements: each later one has what the batch has left, and takes at least one
        job while any is left (a batch may end one job past ``max_bytes``, never starving a
        limited type of large jobs); so each statement's answer is read before the next."""
        params: dict[str, Any] = {"worker": worker, "now": now, "limit": limit, "max_bytes": max_bytes}
        unlimited = [name for name in self.registry.names() if name not in limited and name not in paused]
        answers = [cur.later(self.sql.CLAIM, {**params, "types": self.sql.types(unlimited)})]
        claimed = answers[0].records()
        for name, cap in limited.items():
            if name in paused:
                continue
            left = max_bytes - sum(job.payload_bytes or 0 for job in claimed)
            if len(claimed) >= limit or (claimed and left <= 0):
                break
            if self.sql.dialect == "postgresql":
                cur.scalar(self.sql.LOCK_TYPE_CLAIMS, {"lock": f"tether.max_running.{name}"})
            room = min(limit - len(claimed), cap - int(cur.scalar(self.sql.RUNNING_OF_TYPE, {"type": name})))
            if room > 0:
                of_type = {**params, "limit": room, "max_bytes": left}
                answers.append(cur.later(self.sql.CLAIM, {**of_type, "types": self.sql.types([name])}))
                claimed += answers[-1].records()
        return answers
