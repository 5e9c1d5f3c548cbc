"""``create_file``: write one data file atomically."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from pydantic import JsonValue, model_validator

from .. import fs
from .base import IN_SYNC, SYNCED, UNREADABLE_PAYLOAD, Check, JobType, Payload, Probe
from .files import (
    check_files,
    checked_path,
    enqueue_collision,
    file_paths,
    files_exist,
    with_expected,
    write_locked,
)
from .target import Target

if TYPE_CHECKING:
    from .context import JobContext


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
    # The newline by orjson: appending it after would copy the whole file once more.
    return orjson.dumps(content, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


class CreateFileProbe(Probe):
    """The file exists and holds exactly the bytes the job wrote (``render``)."""

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        return self.check_many([(target, payload)], root, content=content)[0]

    def wants_payload(self, *, content: bool) -> bool:
        return content  # existence only: the path is in the target (``file:<path>``)

    def check_many(self, items: Sequence[tuple[str, str]], root: Path, *, content: bool) -> list[Check]:
        if content:
            expected = [_expected(payload) for _, payload in items]
            if None not in expected:  # every payload readable (only a row changed by hand is not)
                return check_files(root, expected)  # type: ignore[arg-type]  # no None, as checked
            checked = iter(check_files(root, [e for e in expected if e is not None]))
            return [UNREADABLE_PAYLOAD if e is None else next(checked) for e in expected]
        found = files_exist(root, file_paths(items), present=True)
        if found.count(SYNCED) == len(found):  # the common answer, counted in C
            return found
        return [
            c if c is SYNCED or c.status == IN_SYNC else _expecting(c, p)
            for c, (_, p) in zip(found, items, strict=True)
        ]


def _expected(payload: str) -> tuple[str, bytes] | None:
    """The path and bytes a stored payload promises; None if the row cannot be read as one (only
    a row changed by hand: the ledger validated it)."""
    try:
        fields = orjson.loads(payload)
        return fields["path"], render_fields(fields.get("content"), fields.get("text"))
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        return None


def _expecting(check: Check, payload: str | None) -> Check:
    """Existence only read no file: say what was expected, for the report (when the payload
    is at hand; the reconciler adds it otherwise)."""
    if payload is None:
        return check
    try:
        fields = orjson.loads(payload)
        return with_expected(check, render_fields(fields.get("content"), fields.get("text")))
    except (orjson.JSONDecodeError, TypeError, AttributeError):
        return check


class CreateFileType(JobType[CreateFile]):
    name = "create_file"
    payload_model = CreateFile
    probe = CreateFileProbe()

    def prepare(self, payload: CreateFile, root: Path) -> CreateFile:
        path = checked_path(self.name, "path", root, payload.path)
        enqueue_collision(self.name, "path", root, path)
        return payload if path == payload.path else payload.model_copy(update={"path": path})

    def target(self, payload: CreateFile) -> Target:
        return Target.file(payload.path)

    def run(self, payload: CreateFile, ctx: JobContext) -> dict[str, Any]:
        data = render(payload)
        written = write_locked(ctx, payload.path, data, overwrite=payload.overwrite)
        return {"bytes": len(data), "sha256": fs.sha256(data), "written": written}
