"""``adopt``: the operator accepted what is there as a target's expected state (``tether drift
accept``). Its record, completed when it is written, holds the facts accepted: a file's size and
hash (or its absence), an AWS resource's declared fields as they were read. Its handler has no
effect; its probe checks that those facts still hold, so the next check reads the target in sync
until it changes again or another job acts on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from pydantic import Field, JsonValue

from ..errors import InvalidPayload
from .base import IN_SYNC, MISSING, MODIFIED, UNKNOWN, Check, JobType, Payload, Probe, file_facts
from .datafiles import durable
from .datafiles.existence import files_exist, reason_of
from .target import AWS, FILE, Target

if TYPE_CHECKING:
    from .context import JobContext


class Adopt(Payload):
    """What was accepted on ``target`` (an ordering key), by whom and why."""

    job_type: ClassVar[str] = "adopt"

    target: str = Field(min_length=1, max_length=1024)
    by: str = Field(min_length=1, max_length=256)
    reason: str | None = Field(default=None, max_length=2000)
    exists: bool = True
    size: int | None = None
    sha256: str | None = None
    aws: dict[str, JsonValue] | None = None
    """For an AWS target: a ``sync_aws`` payload whose config holds the fields as accepted."""


class AdoptProbe(Probe):
    """A file: present with the accepted size and hash (or absent, as accepted). An AWS resource:
    the ``sync_aws`` probe asked about the accepted config."""

    fingerprints = True  # a file's accept records the fingerprint of the file it read

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        try:
            accepted = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return Check(UNKNOWN, detail="the job's stored payload could not be read")
        kind = Target.parse(target)
        if kind.kind == AWS and isinstance(accepted.get("aws"), dict):
            from .aws.sync import SyncAwsProbe

            return SyncAwsProbe().check(target, orjson.dumps(accepted["aws"]).decode(), root, content=content)
        if kind.kind != FILE:
            return Check(UNKNOWN, detail=f"adopt cannot check a target of kind {kind.kind!r}")
        if not accepted.get("exists", True) or not content:
            return files_exist(root, [kind.identity], present=accepted.get("exists", True))[0]
        return _file_holds(root, kind.identity, accepted.get("size"), accepted.get("sha256"))

    def check_many(self, items: Sequence[tuple[str, str]], root: Path, *, content: bool) -> list[Check]:
        return [self.check(target, payload, root, content=content) for target, payload in items]


def _file_holds(root: Path, rel: str, size: int | None, sha256: str | None) -> Check:
    expected = file_facts(size, sha256)
    try:
        data = durable.read(root, rel)
    except FileNotFoundError:
        return Check(MISSING, expected=expected, detail="accepted present, absent now")
    except OSError as e:
        return Check(UNKNOWN, detail=reason_of(e))
    actual = file_facts(len(data), durable.sha256(data))
    if actual == expected:
        return Check(IN_SYNC)
    return Check(MODIFIED, expected=expected, actual=actual, detail="changed since it was accepted")


class AdoptType(JobType[Adopt]):
    name = "adopt"
    payload_model = Adopt
    probe = AdoptProbe()

    def prepare(self, payload: Adopt, root: Path) -> Adopt:
        if Target.parse(payload.target).kind not in (FILE, AWS):
            raise InvalidPayload(self.name, [f"target: {payload.target!r} is neither file:<path> nor aws:<resource>"])
        return payload

    def target(self, payload: Adopt) -> Target:
        return Target.parse(payload.target)

    def run(self, payload: Adopt, ctx: JobContext) -> dict[str, Any] | None:
        return None  # a record of a decision: nothing to do in the world
