"""``create_file``: write one data file atomically."""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from pydantic import JsonValue, model_validator

from ..errors import PermanentError, UnsafePath
from .base import IN_SYNC, SYNCED, UNREADABLE_PAYLOAD, Check, JobType, Payload, Probe
from .datafiles import durable, fingerprint, paths
from .datafiles.content import check_files, with_expected
from .datafiles.effects import write_known
from .datafiles.existence import file_paths, files_exist
from .datafiles.paths import checked_path
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

    fingerprints = True

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        return self.check_many([(target, payload)], root, content=content)[0]

    def wants_payload(self, *, content: bool) -> bool:
        return content  # existence only: the path is in the target (``file:<path>``)

    def check_many(self, items: Sequence[tuple[str, str]], root: Path, *, content: bool) -> list[Check]:
        if content:
            unreadable: list[int] = []  # only a row changed by hand: the ledger validated them
            checks = check_files(root, _expectations(items, unreadable))
            for n in unreadable:  # in increasing order: each lands where its item was
                checks.insert(n, UNREADABLE_PAYLOAD)
            return checks
        found = files_exist(root, file_paths(items), present=True)
        if found.count(SYNCED) == len(found):  # the common answer, counted in C
            return found
        return [
            c if c is SYNCED or c.status == IN_SYNC else _expecting(c, p)
            for c, (_, p) in zip(found, items, strict=True)
        ]


def _expectations(items: Sequence[tuple[str, str]], unreadable: list[int]) -> Iterator[tuple[str, bytes]]:
    """The path and bytes each item's stored payload promises, rendered as ``check_files`` asks
    for them (inline: a call a file is a good part of a full check); the indexes of payloads
    that cannot be read as one go to ``unreadable`` instead (only a row changed by hand: the
    ledger validated them)."""
    for n, (_, payload) in enumerate(items):
        try:
            fields = orjson.loads(payload)
            expected = fields["path"], render_fields(fields.get("content"), fields.get("text"))
        except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
            unreadable.append(n)
            continue
        yield expected


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
        path = checked_path(self.name, "path", root, payload.path, new_file=True)
        return payload if path == payload.path else payload.model_copy(update={"path": path})

    def target(self, payload: CreateFile) -> Target:
        return Target.file(payload.path)

    def repair(self, payload: CreateFile) -> CreateFile:
        # The file holds other bytes: what the guard against clobbering them protects is what the
        # operator, approving the repair, chose to replace.
        return payload if payload.overwrite else payload.model_copy(update={"overwrite": True})

    def recheck(self, payload: CreateFile, root: Path) -> CreateFile:
        # ``prepare`` costs three path lookups an attempt. What it refuses or resolves (a symlink
        # on the way, a file where a directory must be) the write meets anyway, following no
        # symlink: ``run`` runs ``prepare`` then. Here only what needs no lookup.
        try:
            path = paths.normalize(payload.path)
        except paths.PathRejected as e:
            raise UnsafePath(self.name, "path", payload.path, str(e)) from e
        return payload if path == payload.path else self.prepare(payload, root)

    def run(self, payload: CreateFile, ctx: JobContext) -> dict[str, Any]:
        data = render(payload)
        try:
            written, known = write_known(ctx, payload.path, data, overwrite=payload.overwrite)
        except PermanentError as e:
            # A symlink or a file on the way: what ``prepare`` says of the path now (it resolves a
            # symlink inside the root, and refuses one leading out or a file on the way by name),
            # as it said before every attempt when it ran there.
            if not (isinstance(e.__cause__, OSError) and e.__cause__.errno in _PREPARE_ANSWERS):
                raise
            path = self.prepare(payload, ctx.root).path
            if path == payload.path:
                raise
            written, known = write_known(ctx, path, data, overwrite=payload.overwrite)
        # The fingerprint beside the hash: a content check that finds the file's stat unchanged
        # since need not read it (``fingerprint``; the completion copies it to its column).
        return {
            "bytes": len(data),
            "sha256": durable.sha256(data),
            "written": written,
            "fingerprint": fingerprint.of(known),
        }


_PREPARE_ANSWERS = frozenset((errno.ELOOP, errno.ENOTDIR))
