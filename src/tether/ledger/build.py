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

from ..clock import Clock
from ..errors import InvalidPayload
from ..jobtypes import JobType, Payload, Registry
from ..jobtypes.base import encoder
from . import limits
from .ids import new_id, new_ids
from .record import JobRecord, make_tuple
from .status import JobStatus

_PENDING = JobStatus.PENDING
_Encode = Callable[[Payload], bytes]


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
        # Per payload class its hooks, and for a class with none (build_one's case) its type's
        # name and encoder apart: one look-up and a plain tuple, not three NamedTuple fields.
        self._kinds: tuple[Registry, int, dict[type, _TypeHooks], dict[type, tuple[str, _Encode]]] = (
            registry,
            -1,
            {},
            {},
        )

    def build_many(
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
        the first bad one. The options are checked once, not per job."""
        if not payloads:
            return []
        registry, generation, kinds, plain = self._kinds
        if registry is not self.registry or generation != self.registry.generation:
            kinds, plain = {}, {}
            self._kinds = (self.registry, self.registry.generation, kinds, plain)
        name = (kinds.get(type(payloads[0])) or self._kind(payloads[0], kinds, plain)).name
        now = now or self.clock.now()
        # The defaults need no checking: most enqueues pass none, and right after a commit's
        # fsync every function called costs several times its warm price.
        if all_default(priority, max_attempts, delay, run_at, key, timeout):
            run_at = now
        else:
            run_at = _run_at(name, now, priority, max_attempts, delay, run_at, key, timeout)
        root = self.root
        jobs = []
        ids = [new_id(now)] if len(payloads) == 1 else new_ids(now, len(payloads))
        for payload, job_id in zip(payloads, ids, strict=True):
            kind = kinds.get(type(payload)) or self._kind(payload, kinds, plain)
            if kind.prepare is not None:
                try:
                    payload = kind.prepare(payload, root)
                except UnicodeError as e:  # a path no file system can name
                    raise _unencodable(kind.name, payload, e) from e
            ordering_key = None if kind.ordering_key is None else kind.ordering_key(payload)
            if ordering_key is not None and len(ordering_key) > 1024:
                raise InvalidPayload(
                    kind.name, [f"path: the target {ordering_key[:40]!r}... is longer than 1024 characters"]
                )
            idempotency_key = key if key is not None or kind.idempotency_key is None else kind.idempotency_key(payload)
            encoded = self._encode(kind, payload)
            jobs.append(
                make_tuple(
                    JobRecord,
                    (
                        job_id,
                        kind.name,
                        encoded.decode(),
                        _PENDING,
                        priority,
                        0,
                        max_attempts,
                        None,
                        None,
                        None,
                        now,
                        None,
                        None,
                        run_at,
                        idempotency_key,
                        ordering_key,
                        parent_id,
                        None,
                        None if timeout is None else float(timeout),
                        None,  # progress
                        None,  # quarantine
                        len(encoded),  # payload_bytes
                    ),
                )
            )
        return jobs

    def build_one(self, payload: Payload) -> JobRecord:
        """``build_many([payload])[0]`` with every option at its default, for a payload whose type
        has no hooks: the common single enqueue as straight-line code. Right after a commit's
        fsync each call, loop and list here costs several times its warm price."""
        registry, generation, kinds, plain = self._kinds
        hooks = plain.get(type(payload))
        if hooks is None or registry is not self.registry or generation != registry.generation:
            return self.build_many([payload])[0]
        name, encode = hooks
        now = self.clock.now()
        job_id = new_id(now)
        try:
            encoded = encode(payload)
        except PydanticSerializationError:
            encoded = self._encode(kinds[type(payload)], payload)  # raises InvalidPayload naming the fields
        # The common payload passes limits.payload_problem's first two checks; it runs otherwise.
        if len(encoded) > self.max_payload_bytes or encoded.count(b"[") + encoded.count(b"{") > limits.MAX_DEPTH:
            encoded = self._encode(kinds[type(payload)], payload)
        return make_tuple(
            JobRecord,
            (
                job_id,
                name,
                encoded.decode(),
                _PENDING,
                0,  # priority
                0,  # attempts
                3,  # max_attempts
                None,
                None,
                None,
                now,  # created_at
                None,
                None,
                now,  # run_at
                None,  # idempotency_key
                None,  # ordering_key
                None,  # parent_id
                None,
                None,  # timeout
                None,  # progress
                None,  # quarantine
                len(encoded),  # payload_bytes
            ),
        )

    def _encode(self, kind: _TypeHooks, payload: Payload) -> bytes:
        """The stored JSON of ``payload``, within the limits (``tether.ledger.limits``)."""
        try:
            encoded = kind.encode(payload)
        except PydanticSerializationError as e:
            raise _unencodable(kind.name, payload, e) from e
        problem = limits.payload_problem(encoded, self.max_payload_bytes)
        if problem:
            raise InvalidPayload(kind.name, [problem])
        return encoded

    def _kind(self, payload: Any, kinds: dict[type, _TypeHooks], plain: dict[type, tuple[str, _Encode]]) -> _TypeHooks:
        if not isinstance(payload, Payload):
            raise InvalidPayload(
                "(unknown)", [f"expected a payload model such as CreateFile, got {type(payload).__name__}"]
            )
        kind = kinds[type(payload)] = _TypeHooks.of(self.registry.for_payload(payload), type(payload))
        if kind.prepare is None and kind.ordering_key is None and kind.idempotency_key is None:
            plain[type(payload)] = (kind.name, kind.encode)
        return kind


def all_default(
    priority: Any,
    max_attempts: Any,
    delay: float | timedelta | None,
    run_at: datetime | None,
    key: str | None,
    timeout: float | None,
) -> bool:
    """Whether an enqueue's options are all their defaults, which need no checking (most
    enqueues pass none)."""
    return (
        priority.__class__ is int
        and priority == 0
        and max_attempts.__class__ is int
        and max_attempts == 3
        and delay is None
        and run_at is None
        and key is None
        and timeout is None
    )


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
