"""What a job type is: a payload model, a handler, the target it acts on, and a probe."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict

from .. import fs
from ..errors import UnsafePath
from .target import FILE, Target, file_key

if TYPE_CHECKING:
    from ..context import JobContext


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
    optional = tuple(name for name, info in model.model_fields.items() if info.default is None)
    if not optional:
        return serialize

    def encode(payload: Payload) -> bytes:
        omit = {name for name in optional if name not in payload.model_fields_set}
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

    def prepare(self, payload: P, root: Path) -> P:
        """Checks the model cannot make alone (paths against the data root); returns the payload
        in canonical form. Runs at enqueue and again before every attempt."""
        return payload

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

    @abstractmethod
    def run(self, payload: P, ctx: JobContext) -> dict[str, Any] | None:
        """Perform the effect. Return a small JSON-able result, raise PermanentError for what can
        never succeed; any other exception is retried."""


def checked_path(job_type: str, field: str, root: Path, rel: str) -> str:
    """``rel`` in canonical form if it is safe under ``root``, else UnsafePath naming the field."""
    try:
        return fs.canonical(root, rel)
    except fs.PathRejected as e:
        raise UnsafePath(job_type, field, rel, str(e)) from e


def file_target(rel: str) -> str:
    """The ordering key of a data file: every job touching one path shares it."""
    return file_key(rel)


# -- reconcile probes ----------------------------------------------------------------------------

IN_SYNC = "in_sync"
MISSING = "missing"
MODIFIED = "modified"
UNEXPECTED = "unexpected"
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Check:
    """What a probe found for one target. Sizes in bytes, hashes sha256 hex; a hash is given only
    when it was cheap or needed (never file contents)."""

    status: str
    expected_size: int | None = None
    expected_sha256: str | None = None
    actual_size: int | None = None
    actual_sha256: str | None = None
    detail: str | None = None


SYNCED = Check(IN_SYNC)


class Probe(ABC):
    """How the reconciler checks that the effect of a job's latest completed run still holds.
    It lives with the job type (files now, AWS later); the reconciler iterates over them."""

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


# Absent: no such entry, or a parent is not a directory (so the file cannot exist).
_ABSENT = (errno.ENOENT, errno.ENOTDIR)
_CHUNK = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_noatime = getattr(os, "O_NOATIME", 0)


def open_data_file(path: str) -> int:
    """Open a data file to check it: read-only, never through a final symlink, never blocking on
    a FIFO, and without touching its access time where the OS allows (O_NOATIME needs ownership)."""
    global _noatime
    if _noatime:
        try:
            return os.open(path, _OPEN_FLAGS | _noatime)
        except PermissionError as e:
            if e.errno != errno.EPERM:
                raise
            _noatime = 0
    return os.open(path, _OPEN_FLAGS)


# Module attributes, so a test can swap in a fake that fails (tests run as root, where a
# chmod 000 file is still readable).
lstat_data_file = os.lstat
_S_IFMT, _S_IFDIR = 0o170000, 0o040000


_OUTSIDE = Check(UNKNOWN, detail="the ledger names a path outside the data root")
_MISSING = Check(MISSING)


def _outside(rel: str) -> bool:
    return rel.startswith("/") or "\x00" in rel or (".." in rel and ".." in rel.split("/"))


# A directory holding at least this many of a batch's paths is listed once instead of one lstat
# per path (one getdents for many stats); fewer, and a listing costs more than it saves. And only
# when those paths are a good part of it (directory st_size is ~ 20-40 bytes per entry): a huge
# flat directory would be read whole for every batch.
_LIST_AT = 8
_BYTES_PER_WANTED = 64


# Set by the reconciler for one check: directory -> (temp file names, subdirectory names) of
# every directory a probe listed in full, so the check's walk for leftover temp files does not
# list it again (reading a directory is most of that walk's cost).
listings: ContextVar[dict[str, tuple[list[str], list[str]]] | None] = ContextVar("tether_listings", default=None)


def list_data_dir(path: str, wanted: set[str]) -> dict[str, bool] | None:
    """Of the ``wanted`` names in a directory, those present -> whether each is a directory (from
    d_type, no stat); {} if the directory does not exist; None when listing it does not pay or
    fails (the caller then uses lstat). Holds no more than ``wanted`` (and, during a check, the
    directory's temp files and subdirectories)."""
    try:
        if len(wanted) * _BYTES_PER_WANTED < os.stat(path).st_size:
            return None
        seen = listings.get()
        with os.scandir(path) as entries:
            if seen is None:
                return {e.name: e.is_dir(follow_symlinks=False) for e in entries if e.name in wanted}
            found: dict[str, bool] = {}
            temps: list[str] = []
            subdirs: list[str] = []
            for e in entries:
                name = e.name
                if name.endswith(fs.TEMP_SUFFIX):
                    temps.append(name)
                elif name in wanted:
                    if is_dir := e.is_dir(follow_symlinks=False):
                        subdirs.append(name)
                    found[name] = is_dir
                elif e.is_dir(follow_symlinks=False):
                    subdirs.append(name)
        seen[os.path.normpath(path)] = (temps, subdirs)
        return found
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError:
        return None


def files_exist(root: Path, rels: Sequence[str], *, present: bool) -> list[Check]:
    """Existence of data files, nothing read: each must exist (``present``; anything but a
    directory counts) or be absent. A directory with many of the paths is listed once; a listing
    decides only the expected answer, anything else is looked at again with ``lstat``. A
    ``missing`` answer carries no expectation; the caller adds it."""
    prefix = f"{os.fspath(root)}/"
    out: list[Check | None] = [None] * len(rels)
    by_dir: dict[str, tuple[list[int], list[str]]] = {}  # directory -> (indexes, names)
    for n, rel in enumerate(rels):
        if rel.startswith("/") or "\x00" in rel or (".." in rel and ".." in rel.split("/")):  # _outside, inlined
            out[n] = _OUTSIDE
            continue
        directory, _, name = rel.rpartition("/")
        group = by_dir.get(directory)
        if group is None:
            group = by_dir[directory] = ([], [])
        group[0].append(n)
        group[1].append(name)
    for directory, (indexes, names) in by_dir.items():
        listing = None
        if len(indexes) >= _LIST_AT:
            listing = list_data_dir(prefix + directory if directory else prefix, set(names))
        if listing is None:
            for n in indexes:
                out[n] = _exists(prefix + rels[n], present)
            continue
        get = listing.get
        for n, name in zip(indexes, names, strict=True):
            is_dir = get(name)
            if (is_dir is False) if present else (is_dir is None):
                out[n] = SYNCED
            else:
                out[n] = _exists(prefix + rels[n], present)
    return out  # type: ignore[return-value]  # every slot was filled above


def _exists(path: str, present: bool) -> Check:
    try:
        st = lstat_data_file(path)
    except OSError as e:
        if e.errno in _ABSENT:
            return _MISSING if present else SYNCED
        return Check(UNKNOWN, detail=_reason(e))
    if present:
        return SYNCED if st.st_mode & _S_IFMT != _S_IFDIR else Check(MODIFIED, detail="is a directory")
    kind = _kind(st.st_mode)
    return Check(UNEXPECTED, actual_size=st.st_size if kind is None else None, detail=kind)


def check_file(root: Path, rel: str, expected: bytes) -> Check:
    """Check that one data file holds exactly ``expected``: size first, bytes only when the sizes
    agree, a hash only when the bytes differ."""
    if _outside(rel):
        return _OUTSIDE
    path = f"{os.fspath(root)}/{rel}"
    try:
        fd = open_data_file(path)
    except OSError as e:
        if e.errno in _ABSENT:
            return with_expected(Check(MISSING), expected)
        if e.errno == errno.ELOOP:
            return with_expected(Check(MODIFIED, detail="is a symbolic link"), expected)
        return Check(UNKNOWN, detail=_reason(e))
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind is not None:
            return with_expected(Check(MODIFIED, detail=kind), expected)
        if st.st_size != len(expected):
            return with_expected(Check(MODIFIED, actual_size=st.st_size), expected)
        actual = _differs(fd, expected)
    except OSError as e:
        return Check(UNKNOWN, detail=_reason(e))
    finally:
        os.close(fd)
    if actual is None:
        return SYNCED
    return with_expected(Check(MODIFIED, actual_size=actual[0], actual_sha256=actual[1]), expected)


def _differs(fd: int, expected: bytes) -> tuple[int, str] | None:
    """None when the open file holds exactly ``expected``; else its (size, sha256). The common
    case is one read and one comparison: no hashing."""
    first = os.read(fd, min(_CHUNK, len(expected) + 1))
    if first == expected:  # asked for one byte more than expected: a short read is the end
        return None
    view = memoryview(expected)
    pos = 0
    chunk = first
    while True:
        if not chunk:
            if pos == len(expected):
                return None
            break
        if view[pos : pos + len(chunk)] != chunk:
            break
        pos += len(chunk)
        chunk = os.read(fd, min(_CHUNK, len(expected) - pos + 1))
    # Different bytes: hash what the file holds, from the start, for the report.
    os.lseek(fd, 0, os.SEEK_SET)
    digest, size = hashlib.sha256(), 0
    while chunk := os.read(fd, _CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def file_paths(items: Sequence[tuple[str, str]]) -> list[str]:
    """The data paths of file jobs' ``(target, payload)`` pairs: from the ordering key
    (``file_target``) when there is one, else the payload's ``path`` (no need to validate the
    whole model for it)."""
    out = []
    for key, payload in items:
        target = Target.parse(key)
        out.append(target.identity if target.kind == FILE else orjson.loads(payload)["path"])
    return out


def with_expected(check: Check, expected: bytes | None) -> Check:
    if expected is None:
        return check
    return replace(check, expected_size=len(expected), expected_sha256=fs.sha256(expected))


def _kind(mode: int) -> str | None:
    """None for a regular file, else what the entry is instead."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    return "is not a regular file"


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__
