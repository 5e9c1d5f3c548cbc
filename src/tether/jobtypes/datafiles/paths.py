"""The rules for a data path: what a payload may name under the data root, and its one name.

A data path is relative to the root, names a file (not the root), never climbs out of it (``..``,
or a symlink leading outside), never names tether's own files (the ``.tether/`` directory and
``*.tether-tmp`` temp files), and fits the file system's length limits with room for its temp
file's name. ``canonical`` gives the one name of the file a path reaches, so two spellings of one
file share one ordering key and one lock. These checks are for enqueue and messages; the
operations on data (``durable``) open from the root without following any symlink.
"""

from __future__ import annotations

import errno
import os
import stat
from functools import lru_cache
from pathlib import Path

from ...errors import InvalidPayload, UnsafePath

INTERNAL_DIR = ".tether"
TEMP_SUFFIX = ".tether-tmp"
NAME_MAX = 255  # bytes in one path component (Linux, macOS, the BSDs)
PATH_MAX = 4095
# ``.<name>.<8 hex>.tether-tmp``: the temp file of a write of <name>, in the same directory.
TEMP_OVERHEAD = 1 + 1 + 8 + len(TEMP_SUFFIX)


class PathRejected(ValueError):
    """Why a relative path is not acceptable (the caller names the field and job type)."""


def normalize(rel: str) -> str:
    """The canonical form of a payload path (``a//b/./c`` -> ``a/b/c``), or PathRejected."""
    return _normalized(rel)[0]


def _normalized(rel: str) -> tuple[str, list[str]]:
    """``normalize(rel)`` and its components."""
    if not isinstance(rel, str) or not rel:
        raise PathRejected("is empty")
    if "\x00" in rel:
        raise PathRejected("contains a NUL byte")
    if "\\" in rel:
        raise PathRejected("contains a backslash")
    if rel.startswith("/"):
        raise PathRejected("is absolute")
    parts = rel.split("/")
    if "" in parts or "." in parts:  # two scans in C, where a filter is a loop of Python
        parts = [p for p in parts if p and p != "."]
        rel = "/".join(parts)
    if ".." in parts:
        raise PathRejected("contains '..'")
    if not parts:
        raise PathRejected("names the data root itself, not a file")
    _check_internal(parts)
    if len(rel) > _SHORT:  # a shorter path cannot break a length limit, however it is encoded
        _check_lengths(parts)
    return rel, parts


# The longest path (in characters) whose every encoding fits every length limit: UTF-8 (with
# surrogates escaped) spends at most 4 bytes a character, and the tightest limit is a file name's.
_SHORT = (NAME_MAX - TEMP_OVERHEAD) // 4


def _check_internal(parts: list[str]) -> None:
    if parts[0] == INTERNAL_DIR:
        raise PathRejected(f"is inside tether's own {INTERNAL_DIR}/ directory")
    if parts[-1].endswith(TEMP_SUFFIX):
        raise PathRejected(f"ends in {TEMP_SUFFIX}, which tether reserves for its temp files")


def _check_lengths(parts: list[str]) -> None:
    """Names the file system would refuse at run time, refused now: a component over NAME_MAX
    bytes, a file name too long for its temp file's name, a path over PATH_MAX."""
    total = 0
    for n, part in enumerate(parts, 1):
        size = len(part.encode("utf-8", "surrogatepass"))
        total += size + 1
        if size > NAME_MAX:
            raise PathRejected(f"has a component of {size} bytes; at most {NAME_MAX} are allowed")
        if n == len(parts) and size > NAME_MAX - TEMP_OVERHEAD:
            raise PathRejected(
                f"has a file name of {size} bytes; at most {NAME_MAX - TEMP_OVERHEAD} are allowed "
                f"({NAME_MAX} less the {TEMP_OVERHEAD} of the temp file tether writes it through)"
            )
    if total - 1 > PATH_MAX:
        raise PathRejected(f"is {total - 1} bytes long; at most {PATH_MAX} are allowed")


def resolve(root: Path, rel: str) -> Path:
    """The absolute path of ``rel`` under ``root``, refusing anything that escapes it (including
    through a symlink anywhere on the way). The file itself need not exist. For messages and
    enqueue-time checks: operations on data go through ``durable.data_file``, which follows no symlink."""
    return Path(_resolve(root, rel)[0])


def canonical(root: Path, rel: str) -> str:
    """The one name of the file ``rel`` names: its resolved path relative to the real root. Two
    spellings of one file (through a symlinked directory inside the root) share it, so they
    share one ordering key and one path lock. tether's own files are refused however they are
    reached (``ln -s .tether data/tl`` makes ``tl/locks/paths.lock`` no data path)."""
    return _resolve(root, rel)[1]


def _resolve(root: Path, rel: str, *, new_file: bool = False) -> tuple[str, str, str | None]:
    """(absolute, relative to the real root, the first directory on the way that is a regular
    file) of ``rel``, checked. Walks only the components under the root, one lstat each, and
    hands any symlink met on the way to realpath; the third is None where the walk met no file on
    the way, and past a symlink it is looked for only for a ``new_file``."""
    norm, parts = _normalized(rel)
    top = real_root(os.fspath(root))
    path = top
    last = len(parts) - 1
    for n, part in enumerate(parts):
        path = f"{path}/{part}"
        # Asked first, since most walks end at a missing entry (a new file, a new directory):
        # ``access`` answers that without the exception ``lstat`` raises or the result it builds.
        # An entry it cannot see (a directory on the way not searchable) is left to the run, as
        # ``_file_on_the_way`` leaves it.
        if not os.access(path, os.F_OK, follow_symlinks=False):
            break  # nothing below a missing entry exists, so no symlink can lead elsewhere
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            break  # removed since
        if stat.S_ISLNK(mode):
            absolute, resolved = _resolve_links(top, norm)
            return absolute, resolved, _file_on_the_way(top, resolved) if new_file else None
        if n < last and stat.S_ISREG(mode):  # nothing below a file exists either
            return f"{top}/{norm}", norm, "/".join(parts[: n + 1])
    else:
        return path, norm, None
    return f"{top}/{norm}", norm, None


def _resolve_links(top: str, norm: str) -> tuple[str, str]:
    for _ in range(3):
        try:
            target = os.path.realpath(os.path.join(top, norm))
            break
        except OSError as e:  # a symlink replaced by a directory between lstat and readlink
            if e.errno != errno.EINVAL:
                raise
    else:
        raise PathRejected("kept changing while it was resolved (a symlink swapped back and forth)")
    if target != top and not target.startswith(top + os.sep):
        raise PathRejected("resolves (through a symlink) outside the data root")
    if target == top:
        raise PathRejected("names the data root itself, not a file")
    rel = os.path.relpath(target, top).replace(os.sep, "/")
    try:
        _check_internal(rel.split("/"))
        _check_lengths(rel.split("/"))
    except PathRejected as e:
        raise PathRejected(f"resolves (through a symlink) to {rel!r}, which {e}") from None
    return target, rel


@lru_cache(maxsize=64)
def real_root(root: str) -> str:
    # The root is resolved once per process; paths under it are resolved on every call.
    return os.path.realpath(root)


def checked_path(job_type: str, field: str, root: Path, rel: str, *, new_file: bool = False) -> str:
    """``rel`` in canonical form if it is safe under ``root``, else UnsafePath naming the field.
    ``new_file``: the job makes the file, so a directory on its way that is a regular file now
    (``a.json`` for ``a.json/b.json``) is refused too (InvalidPayload): the job could never
    succeed. That is only a hint: the handler's own open is the authority, so a file made or
    removed after this check is still found at run time."""
    try:
        _, path, on_the_way = _resolve(root, rel, new_file=new_file)
    except PathRejected as e:
        raise UnsafePath(job_type, field, rel, str(e)) from e
    if new_file and on_the_way is not None:
        raise InvalidPayload(job_type, [f"{field}: {path!r} cannot be made: {on_the_way} is a file, not a directory"])
    return path


def _file_on_the_way(top: str, rel: str) -> str | None:
    """The first directory on the way to ``rel`` (canonical) under the real root ``top`` that is
    a regular file, if any."""
    parts = rel.split("/")[:-1]
    real = f"{top}/"
    for n in range(1, len(parts) + 1):
        try:
            mode = os.lstat(real + "/".join(parts[:n])).st_mode
        except OSError:
            return None  # missing (made at run time) or unreadable: the run decides
        if stat.S_ISREG(mode):
            return "/".join(parts[:n])
        if not stat.S_ISDIR(mode):
            return None  # a symlink or something odd: the run decides
    return None
