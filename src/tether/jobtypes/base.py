"""What a job type is: a payload model, a handler, the target it acts on, and a probe."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from .target import Target

if TYPE_CHECKING:
    from .context import JobContext


class Payload(BaseModel):
    """Base of every payload model. Unknown fields are refused, so a typo is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_type: ClassVar[str]

    def to_json(self) -> bytes:
        """The stored form: every field, except optional ones the caller never set."""
        return encoder(type(self))(self)


@cache
def encoder(model: type[Payload]) -> Callable[[Payload], bytes]:
    """``to_json`` for payloads of ``model``, with its per-model work done once."""
    serialize = model.__pydantic_serializer__.to_json
    optional = {name for name, info in model.model_fields.items() if info.default is None}
    if not optional:
        return serialize

    def encode(payload: Payload) -> bytes:
        # The fields set read without ``model_fields_set``'s frame, and the difference in C:
        # every enqueue encodes.
        omit = optional - payload.__pydantic_fields_set__
        return serialize(payload, exclude=omit or None)

    return encode


P = TypeVar("P", bound=Payload)


class JobType(ABC, Generic[P]):
    """One kind of side effect. Adding a type adds a subclass, never a table or migration."""

    name: ClassVar[str]
    payload_model: ClassVar[type[Payload]]
    probe: ClassVar[Probe | None] = None
    """How the reconciler checks this type's effect; None for types it cannot check."""
    timeout: ClassVar[float | None] = None
    """Seconds an attempt may run (``enqueue(timeout=)`` overrides it per job); past it the
    handler is cancelled and the attempt retried. None: no limit."""

    max_running: int | None = None
    """At most this many jobs of the type claimed at once, across every worker and machine (the
    claim counts them); None: no limit."""

    def prepare(self, payload: P, root: Path) -> P:
        """Checks the model cannot make alone (paths against the data root); returns the payload
        in canonical form. Runs at enqueue and (through ``recheck``) before every attempt."""
        return payload

    def recheck(self, payload: P, root: Path) -> P:
        """The checks before each attempt of a payload ``prepare`` passed at enqueue: ``prepare``
        again, unless the type does less because its handler meets what the rest would refuse
        (``create_file``: its write follows no symlink, and runs ``prepare`` when it meets one)."""
        return self.prepare(payload, root)

    def target(self, payload: P) -> Target | None:
        """What this job acts on (``Target.file(path)``, an AWS resource): jobs with one target
        take effect in enqueue order, and the reconciler checks each target's latest job."""
        return None

    def ordering_key(self, payload: P) -> str | None:
        """The target as stored in the ledger; override ``target``, not this."""
        target = self.target(payload)
        return None if target is None else target.key

    def idempotency_key(self, payload: P) -> str | None:
        """A key derived from the payload itself (explicit keys passed to enqueue win)."""
        return None

    def repair(self, payload: P) -> P:
        """The payload of a repair of this job (a repair plan runs a target's latest completed job
        again when its effect no longer holds): the same payload, unless one of its own guards
        would refuse to restore what the job did."""
        return payload

    @abstractmethod
    def run(self, payload: P, ctx: JobContext) -> dict[str, Any] | None | Awaitable[dict[str, Any] | None]:
        """Perform the effect. Return a small JSON-able result, raise PermanentError for what can
        never succeed; any other exception is retried. ``async def run`` is a handler too: the
        worker's thread runs it on an event loop of its own, and a cancellation (timeout,
        shutdown, lost lease, operator) cancels its current await (``worker.executor``)."""


# -- reconcile probes ----------------------------------------------------------------------------

IN_SYNC = "in_sync"
MISSING = "missing"
MODIFIED = "modified"
UNEXPECTED = "unexpected"
UNKNOWN = "unknown"


ADD = "ADD"
REMOVE = "REMOVE"
NOT_EQUAL = "NOT_EQUAL"


@dataclass(frozen=True, slots=True)
class Difference:
    """One field that does not hold what the ledger expects (CloudFormation's
    PropertyDifference): ``path`` names the field (``tags.env``, ``size``); ``kind`` is ADD (present,
    not expected), REMOVE (expected, absent) or NOT_EQUAL. Values are what a probe may show:
    sizes, hashes, settings; never file contents or secrets."""

    path: str
    expected: Any
    actual: Any
    kind: str = NOT_EQUAL

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "expected": self.expected, "actual": self.actual, "kind": self.kind}


@dataclass(frozen=True, slots=True)
class Check:
    """What a probe found for one target: its status, what was expected and what is there (small
    JSON values: a file's ``{"size", "sha256"}``, a resource's declared settings), the fields that
    differ, and a detail for the operator."""

    status: str
    expected: Any = None
    actual: Any = None
    differences: tuple[Difference, ...] = ()
    detail: str | None = None


def file_facts(size: int | None, sha256: str | None = None) -> dict[str, Any]:
    """A file's side of a check: its size in bytes and, when read, its sha256 (never its bytes)."""
    return {"size": size, "sha256": sha256}


def differences_of(expected: Any, actual: Any) -> tuple[Difference, ...]:
    """The fields of two flat dicts that differ (a field either side lacks is ADD or REMOVE; a
    None value on the actual side means unknown, not different)."""
    if not isinstance(expected, dict) or not isinstance(actual, dict):
        return ()
    out = []
    for name in sorted(expected.keys() | actual.keys()):
        if name not in actual:
            out.append(Difference(name, expected[name], None, REMOVE))
        elif name not in expected:
            out.append(Difference(name, None, actual[name], ADD))
        elif actual[name] is not None and expected[name] != actual[name]:
            out.append(Difference(name, expected[name], actual[name], NOT_EQUAL))
    return tuple(out)


SYNCED = Check(IN_SYNC)
UNREADABLE_PAYLOAD = Check(UNKNOWN, detail="the job's stored payload could not be read")


class Probe(ABC):
    """How the reconciler checks that the effect of a job's latest completed run still holds.
    It lives with the job type (the file types', each AWS resource type's); the reconciler iterates
    over them."""

    remote: str | None = None
    """The remote world the probe reads (``"aws"``), which a check may leave alone (``--no-aws``);
    None: the data root, always checked."""
    fingerprints: bool = False
    """Whether the effect of a completed job of this type is a data file's bytes, of which the job
    (or an accept) records a fingerprint (``datafiles/fingerprint.py``): a content check then
    reads the file only when its stat no longer reads as that fingerprint, and asks ``check``
    (with the payload) about those alone."""

    @abstractmethod
    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        """Compare the world with the effect of a completed job on ``target`` (its ordering key,
        as the job type's ``ordering_key`` made it) whose stored payload is ``payload`` (JSON
        text). With ``content`` false, only existence is checked. Never raises for an unreadable
        target: that is ``unknown``, never ``missing``."""

    def wants_payload(self, *, content: bool) -> bool:
        """Whether ``check`` needs the payload (the reconciler then reads it; otherwise it passes
        None and never touches the job's row)."""
        return True

    def check_many(self, items: Sequence[tuple[str, str]], root: Path, *, content: bool) -> list[Check]:
        """``check`` for several ``(target, payload)`` pairs, answers in the same order. The
        reconciler calls this once per batch of targets of this type; a probe overrides it to
        batch the world's side too (one tight loop of stats, one AWS describe for many ids)."""
        return [self.check(target, payload, root, content=content) for target, payload in items]

    def untracked(self, owner: str, seen: set[str]) -> dict[str, str]:
        """Resources of a ``remote`` world that carry ``owner``'s ownership tag, by target key, with
        a detail each (``seen``: the targets the check asked about). Asked only of a remote probe,
        and only with ``--untracked``; the data root's untracked files are the reconciler's own."""
        return {}
