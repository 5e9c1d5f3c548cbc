"""Turning payloads into validated jobs before any transaction opens.

A job built here is the row it will be: a pending ``JobRecord``. The same tuple is
inserted and returned in its ``InsertResult``, so nothing is copied on the way to the database.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from pydantic_core import PydanticSerializationError

from .. import tracing
from ..clock import Clock
from ..errors import InvalidPayload
from ..jobtypes import JobType, Payload, Registry
from ..jobtypes.base import encoder
from . import limits
from .ids import new_id, new_ids
from .record import JobRecord, make_tuple
from .status import JobStatus

_PENDING = JobStatus.PENDING


class _TypeHooks(NamedTuple):
    """How to build jobs from one payload class: its type's name and hooks, each None where the
    type keeps JobType's default (which does nothing), and its JSON encoder."""

    name: str
    prepare: Callable[[Payload, Path], Payload] | None
    ordering_key: Callable[[Payload], str | None] | None
    idempotency_key: Callable[[Payload], str | None] | None
    encode: Callable[[Payload], bytes]

    @classmethod
    def of(cls, job_type: JobType[Any], payload_class: type[Payload]) -> _TypeHooks:
        def overridden(name: str) -> bool:
            return getattr(type(job_type), name) is not getattr(JobType, name)

        def hook(name: str) -> Any:
            return getattr(job_type, name) if overridden(name) else None

        # ``ordering_key`` renders ``target`` unless a type overrides it directly.
        ordering_key = job_type.ordering_key if overridden("target") or overridden("ordering_key") else None
        return cls(job_type.name, hook("prepare"), ordering_key, hook("idempotency_key"), encoder(payload_class))


class Builder:
    """Builds jobs for one registry and data root; per payload class, what to call is looked up
    once and kept until the registry changes."""

    def __init__(
        self, registry: Registry, root: Path, clock: Clock, *, max_payload_bytes: int = limits.DEFAULT_MAX_PAYLOAD_BYTES
    ) -> None:
        self.registry = registry
        self.root = root
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self._kinds: tuple[Registry, int, dict[type, _TypeHooks]] = (registry, -1, {})

    def build(
        self,
        payloads: Sequence[Payload],
        *,
        priority: int = 0,
        max_attempts: int = 3,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        key: str | None = None,
        parent_id: str | None = None,
        timeout: float | None = None,
        now: datetime | None = None,
    ) -> list[JobRecord]:
        """Validate jobs that share their options (and enqueue time); raises InvalidPayload for
        the first bad one. The options are checked once, not per job; one job is a list of one."""
        if not payloads:
            return []
        registry, generation, kinds = self._kinds
        if registry is not self.registry or generation != self.registry.generation:
            kinds = {}
            self._kinds = (self.registry, self.registry.generation, kinds)
        now = now or self.clock.now()
        # The defaults need no checking, and most enqueues pass none.
        if (
            priority.__class__ is int
            and priority == 0
            and max_attempts.__class__ is int
            and max_attempts == 3
            and delay is None
            and run_at is None
            and key is None
            and timeout is None
        ):
            run_at = now
        else:
            name = (kinds.get(type(payloads[0])) or self._kind(payloads[0], kinds)).name
            run_at = _run_at(name, now, priority, max_attempts, delay, run_at, key, timeout)
            timeout = None if timeout is None else float(timeout)
        shared = (priority, max_attempts, now, run_at, parent_id, timeout, tracing.traceparent())
        ids = [new_id(now)] if len(payloads) == 1 else new_ids(now, len(payloads))
        jobs = []  # a loop, not a comprehension: that would be a call of its own per enqueue
        for payload, job_id in zip(payloads, ids, strict=True):
            jobs.append(self._job(kinds.get(type(payload)) or self._kind(payload, kinds), payload, job_id, key, shared))
        return jobs

    def _job(
        self, kind: _TypeHooks, payload: Payload, job_id: str, key: str | None, shared: tuple[Any, ...]
    ) -> JobRecord:
        """One pending job: ``payload`` prepared, its keys derived, and its JSON within the limits;
        ``shared`` is (priority, max_attempts, created_at, run_at, parent_id, timeout, traceparent)."""
        if kind.prepare is not None:
            try:
                payload = kind.prepare(payload, self.root)
            except UnicodeError as e:  # a path no file system can name
                raise _unencodable(kind.name, payload, e) from e
        ordering_key = None if kind.ordering_key is None else kind.ordering_key(payload)
        if ordering_key is not None and len(ordering_key) > 1024:
            raise InvalidPayload(
                kind.name, [f"path: the target {ordering_key[:40]!r}... is longer than 1024 characters"]
            )
        idempotency_key = key if key is not None or kind.idempotency_key is None else kind.idempotency_key(payload)
        # The stored JSON, within the limits (tether.ledger.limits).
        try:
            encoded = kind.encode(payload)
        except PydanticSerializationError as e:
            raise _unencodable(kind.name, payload, e) from e
        problem = limits.payload_problem(encoded, self.max_payload_bytes)
        if problem:
            raise InvalidPayload(kind.name, [problem])
        priority, max_attempts, created_at, run_at, parent_id, timeout, traceparent = shared
        return make_tuple(
            JobRecord,
            (
                job_id,
                kind.name,
                encoded.decode(),
                _PENDING,
                priority,
                0,  # attempts
                max_attempts,
                None,  # last_error
                None,  # locked_by
                None,  # locked_at
                created_at,
                None,  # claimed_at
                None,  # completed_at
                run_at,
                idempotency_key,
                ordering_key,
                parent_id,
                None,  # result
                timeout,
                None,  # progress
                None,  # quarantine
                len(encoded),  # payload_bytes
                0,  # snoozes
                traceparent,
            ),
        )

    def _kind(self, payload: Any, kinds: dict[type, _TypeHooks]) -> _TypeHooks:
        if not isinstance(payload, Payload):
            raise InvalidPayload(
                "(unknown)", [f"expected a payload model such as CreateFile, got {type(payload).__name__}"]
            )
        kind = kinds[type(payload)] = _TypeHooks.of(self.registry.for_payload(payload), type(payload))
        return kind


def _run_at(
    name: str,
    now: datetime,
    priority: Any,
    max_attempts: Any,
    delay: float | timedelta | None,
    run_at: datetime | None,
    key: str | None,
    timeout: float | None,
) -> datetime:
    """When jobs with these options may first run; InvalidPayload for an option out of bounds."""
    problem = limits.option_problem(priority, max_attempts, delay, now)
    if problem:
        raise InvalidPayload(name, [problem])
    if key is not None and len(key) > 512:
        raise InvalidPayload(name, [f"key: at most 512 characters, got {len(key)}"])
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < 1e9
    ):
        raise InvalidPayload(name, [f"timeout: must be a number of seconds > 0, got {timeout!r}"])
    if run_at is not None and delay is not None:
        raise InvalidPayload(name, ["give run_at or delay, not both"])
    if delay is not None:
        return limits.delay_until(now, delay)
    if run_at is not None and run_at.tzinfo is None:
        raise InvalidPayload(name, ["run_at: must be timezone-aware (UTC)"])
    return run_at or now


def _unencodable(job_type: str, payload: Payload, error: Exception) -> InvalidPayload:
    """InvalidPayload for a payload that cannot be stored as JSON, naming the fields at fault."""
    problems = list(limits.unencodable_strings(payload))
    if not problems:
        problems = [f"(payload): cannot be stored as JSON ({type(error).__name__}: {str(error).splitlines()[0]})"]
    return InvalidPayload(job_type, problems)
