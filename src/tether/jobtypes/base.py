"""What a job type is: a payload model, a handler, the target it acts on, and (later) a probe."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict

from .. import fs
from ..errors import UnsafePath

if TYPE_CHECKING:
    from ..context import JobContext


class Payload(BaseModel):
    """Base of every payload model. Unknown fields are refused, so a typo is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_type: ClassVar[str]

    def to_json(self) -> bytes:
        """The stored form: every field, except optional ones the caller never set."""
        omit = {
            name
            for name, info in type(self).model_fields.items()
            if name not in self.model_fields_set and info.default is None
        }
        return orjson.dumps(self.model_dump(mode="json", exclude=omit))


P = TypeVar("P", bound=Payload)


class JobType(ABC, Generic[P]):
    """One kind of side effect. Adding a type adds a subclass, never a table or migration."""

    name: ClassVar[str]
    payload_model: ClassVar[type[Payload]]

    def prepare(self, payload: P, root: Path) -> P:
        """Checks the model cannot make alone (paths against the data root); returns the payload
        in canonical form. Runs at enqueue and again before every attempt."""
        return payload

    def ordering_key(self, payload: P) -> str | None:
        """The target this job acts on: jobs with one key take effect in enqueue order."""
        return None

    def idempotency_key(self, payload: P) -> str | None:
        """A key derived from the payload itself (explicit keys passed to enqueue win)."""
        return None

    @abstractmethod
    def run(self, payload: P, ctx: JobContext) -> dict[str, Any] | None:
        """Perform the effect. Return a small JSON-able result, raise PermanentError for what can
        never succeed; any other exception is retried."""


def checked_path(job_type: str, field: str, root: Path, rel: str) -> str:
    """``rel`` in canonical form if it is safe under ``root``, else UnsafePath naming the field."""
    try:
        fs.resolve(root, rel)
        return fs.normalize(rel)
    except fs.PathRejected as e:
        raise UnsafePath(job_type, field, rel, str(e)) from e


def file_target(rel: str) -> str:
    """The ordering key of a data file: every job touching one path shares it."""
    return f"file:{rel}"
