"""``create_file``: write one data file atomically."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from pydantic import JsonValue, model_validator

from .. import fs
from ..errors import PermanentError
from .base import (
    IN_SYNC,
    SYNCED,
    Check,
    JobType,
    Payload,
    Probe,
    check_file,
    checked_path,
    file_paths,
    files_exist,
    with_expected,
)
from .target import Target

if TYPE_CHECKING:
    from ..context import JobContext


class CreateFile(Payload):
    """Write ``content`` (any JSON value, rendered as indented JSON) or ``text`` (UTF-8) to
    ``path``. With ``overwrite`` false, a different existing file is never clobbered."""

    job_type: ClassVar[str] = "create_file"

    path: str
    content: JsonValue = None
    text: str | None = None
    overwrite: bool = False

    @model_validator(mode="after")
    def _one_body(self) -> CreateFile:
        has_content = "content" in self.model_fields_set
        if has_content == (self.text is not None):
            raise ValueError("give exactly one of 'content' (a JSON value) or 'text' (a string)")
        return self


def render(payload: CreateFile) -> bytes:
    """The exact bytes a create_file job writes. The reconciler compares files against this."""
    return render_fields(payload.content, payload.text)


def render_fields(content: JsonValue, text: str | None) -> bytes:
    """``render`` from the payload's fields: the reconciler renders stored payloads (validated
    when they were enqueued) without building the model again, which costs more than the rest
    of a file's check. Any field that changes the bytes must be an argument here."""
    if text is not None:
        return text.encode("utf-8")
    return orjson.dumps(content, option=orjson.OPT_INDENT_2) + b"\n"


class CreateFileProbe(Probe):
    """The file exists and holds exactly the bytes the job wrote (``render``)."""

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        return self.check_many([(target, payload)], root, content=content)[0]

    def wants_payload(self, *, content: bool) -> bool:
        return content  # existence only: the path is in the target (``file:<path>``)

    def check_many(self, items: Sequence[tuple[str, str]], root: Path, *, content: bool) -> list[Check]:
        if content:
            out = []
            for _, payload in items:
                fields = orjson.loads(payload)
                out.append(check_file(root, fields["path"], render_fields(fields.get("content"), fields.get("text"))))
            return out
        found = files_exist(root, file_paths(items), present=True)
        return [
            c if c is SYNCED or c.status == IN_SYNC else _expecting(c, p)
            for c, (_, p) in zip(found, items, strict=True)
        ]


def _expecting(check: Check, payload: str | None) -> Check:
    """Existence only read no file: say what was expected, for the report (when the payload
    is at hand; the reconciler adds it otherwise)."""
    if payload is None:
        return check
    fields = orjson.loads(payload)
    return with_expected(check, render_fields(fields.get("content"), fields.get("text")))


class CreateFileType(JobType[CreateFile]):
    name = "create_file"
    payload_model = CreateFile
    probe = CreateFileProbe()

    def prepare(self, payload: CreateFile, root: Path) -> CreateFile:
        path = checked_path(self.name, "path", root, payload.path)
        return payload if path == payload.path else payload.model_copy(update={"path": path})

    def target(self, payload: CreateFile) -> Target:
        return Target.file(payload.path)

    def run(self, payload: CreateFile, ctx: JobContext) -> dict[str, Any]:
        data = render(payload)
        digest = fs.sha256(data)
        with fs.path_lock(ctx.root, payload.path):
            target = fs.absolute(ctx.root, payload.path)
            if ctx.job.attempts > 1:
                # An earlier attempt may have died mid-write; only a re-run can have left a
                # temp file for this path, so first attempts skip the directory scan.
                fs.remove_stale_temps(target)
            size = _size(target)
            if size == len(data) and _read(target) == data:
                # A re-run after the write landed but its completion did not commit.
                return {"bytes": len(data), "sha256": digest, "written": False}
            if size is not None and not payload.overwrite:
                raise PermanentError(f"{payload.path} exists with different content and overwrite is false")
            ctx.confirm_lease()
            fs.atomic_write(target, data)
        return {"bytes": len(data), "sha256": digest, "written": True}


def _read(target: str) -> bytes:
    with open(target, "rb") as f:
        return f.read()


def _size(target: str) -> int | None:
    """The size of the file at ``target``, None if there is none (one stat answers both)."""
    try:
        return os.stat(target).st_size
    except FileNotFoundError:
        return None
