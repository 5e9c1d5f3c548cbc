"""The data root: safe path resolution, the one atomic write, delete, per-path locks.

A reader of a data file sees the old complete file or the new complete file, never a torn one.
tether's own files are the ``.tether/`` directory under the root and ``*.tether-tmp`` temp
files; neither is ever data.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import stat
import struct
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import lru_cache
from pathlib import Path

INTERNAL_DIR = ".tether"
TEMP_SUFFIX = ".tether-tmp"

_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


class PathRejected(ValueError):
    """Why a relative path is not acceptable (the caller names the field and job type)."""


def normalize(rel: str) -> str:
    """The canonical form of a payload path (``a//b/./c`` -> ``a/b/c``), or PathRejected."""
    if not isinstance(rel, str) or not rel:
        raise PathRejected("is empty")
    if "\x00" in rel:
        raise PathRejected("contains a NUL byte")
    if "\\" in rel:
        raise PathRejected("contains a backslash")
    if rel.startswith("/"):
        raise PathRejected("is absolute")
    parts = [p for p in rel.split("/") if p and p != "."]
    if ".." in parts:
        raise PathRejected("contains '..'")
    if not parts:
        raise PathRejected("names the data root itself, not a file")
    if parts[0] == INTERNAL_DIR:
        raise PathRejected(f"is inside tether's own {INTERNAL_DIR}/ directory")
    if parts[-1].endswith(TEMP_SUFFIX):
        raise PathRejected(f"ends in {TEMP_SUFFIX}, which tether reserves for its temp files")
    return "/".join(parts)


def resolve(root: Path, rel: str) -> Path:
    """The absolute path of ``rel`` under ``root``, refusing anything that escapes it (including
    through a symlink anywhere on the way). The file itself need not exist."""
    return Path(_resolve(root, rel)[0])


def absolute(root: Path, rel: str) -> str:
    """``resolve`` as text, for handlers that only hand the path to the system."""
    return _resolve(root, rel)[0]


def canonical(root: Path, rel: str) -> str:
    """The one name of the file ``rel`` names: its resolved path relative to the real root. Two
    spellings of one file (through a symlinked directory inside the root) share it, so they
    share one ordering key and one path lock."""
    return _resolve(root, rel)[1]


def _resolve(root: Path, rel: str) -> tuple[str, str]:
    """(absolute, relative to the real root) of ``rel``, checked. Walks only the components
    under the root, one lstat each, and hands any symlink met on the way to realpath."""
    norm = normalize(rel)
    real_root = _real_root(os.fspath(root))
    path = real_root
    for part in norm.split("/"):
        path = f"{path}/{part}"
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            break  # nothing below a missing entry exists, so no symlink can lead elsewhere
        if stat.S_ISLNK(mode):
            return _resolve_links(real_root, norm)
    else:
        return path, norm
    return f"{real_root}/{norm}", norm


def _resolve_links(real_root: str, norm: str) -> tuple[str, str]:
    target = os.path.realpath(os.path.join(real_root, norm))
    if target != real_root and not target.startswith(real_root + os.sep):
        raise PathRejected("resolves (through a symlink) outside the data root")
    if target == real_root:
        raise PathRejected("names the data root itself, not a file")
    return target, os.path.relpath(target, real_root).replace(os.sep, "/")


@lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    # The root is resolved once per process; paths under it are resolved on every call.
    real = os.path.realpath(root)
    _roots.update((real, os.path.abspath(root)))
    _durable_dirs.update(_roots)
    return real


# Directories whose entries this process has made durable, each with every directory above it up
# to its data root. A file is not durable until all of those are, and a directory another thread
# or process has just made may not be yet (its maker may still be on the way to fsyncing the
# parent; ext4 without a journal does not carry a mkdir along with a later fsync). Data roots
# count as durable: they exist before tether writes into them (see ``make_root``). A directory
# removed and made again by someone else while this process runs is taken as durable.
_roots: set[str] = set()
_durable_dirs: set[str] = set()
_DURABLE_DIRS_MAX = 65_536  # past this the set starts again: forgetting costs only an fsync


def _durable_entry(directory: str, made: list[str]) -> None:
    """Make the entries of ``directory`` and of the directories above it durable, up to its data
    root (outside any root: the directories this write ``made`` and ``directory`` itself),
    parent first, so the set never holds a directory whose parents are not durable yet."""
    d = os.path.abspath(directory)
    if d in _durable_dirs:
        return
    chain = [d]
    if any(d.startswith(root.rstrip("/") + "/") for root in _roots):
        parent = os.path.dirname(d)
        while parent not in _durable_dirs and parent != chain[-1]:  # ends at the root at the latest
            chain.append(parent)
            parent = os.path.dirname(parent)
    else:
        chain += [m for m in made if m != d]
    if len(_durable_dirs) > _DURABLE_DIRS_MAX:
        _durable_dirs.clear()
        _durable_dirs.update(_roots)
    for d in sorted(chain, key=len):
        fsync_dir(os.path.dirname(d))
        _durable_dirs.add(d)


def _make_dirs(directory: str) -> list[str]:
    """Make ``directory`` and any missing parents; returns the ones made (absolute)."""
    missing = []
    d = os.path.abspath(directory)
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        missing.append(d)
        d = os.path.dirname(d)
    os.makedirs(directory, exist_ok=True)
    return missing


def make_root(root: str | os.PathLike[str]) -> None:
    """Make a data root, durably, if it is missing."""
    for d in sorted(_make_dirs(os.fspath(root)), key=len):
        fsync_dir(os.path.dirname(d))


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once: temp file in the same directory, write, fsync,
    rename over the target, fsync the directory. The first time this process writes into a
    directory it also makes the directories above it durable, up to the data root, before the
    rename. The temp file is removed on any error, which leaves the target as it was."""
    directory, name = os.path.split(os.fspath(path))
    directory = directory or "."
    tmp = os.path.join(directory, f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    made: list[str] = []
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    except FileNotFoundError:  # the directory is missing: rarer than a stat to check it first
        made = _make_dirs(directory)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if directory not in _durable_dirs:
            _durable_entry(directory, made)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(directory)


def delete(path: str | os.PathLike[str]) -> bool:
    """Remove ``path`` durably; False if it was not there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(os.path.dirname(os.fspath(path)) or ".")
    return True


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temps(path: str | os.PathLike[str]) -> int:
    """Remove temp files left for ``path`` by interrupted writes. Call only while holding the
    path's lock, so no live write of this path owns one of them."""
    removed = 0
    directory, target = os.path.split(os.fspath(path))
    try:
        entries = os.scandir(directory or ".")
    except FileNotFoundError:
        return 0
    prefix = f".{target}."
    with entries:
        for entry in entries:
            name = entry.name
            if (
                name.startswith(prefix)
                and name.endswith(TEMP_SUFFIX)
                and len(name) == len(prefix) + 8 + len(TEMP_SUFFIX)
            ):
                _unlink_quietly(entry.path)
                removed += 1
    return removed


LOCK_STRIPES = 1024  # lock files, where open file description locks are missing
LOCK_FILE = "paths.lock"
_held = threading.local()
# Linux's open file description locks: byte-range locks owned by one open() (so threads of one
# process exclude each other, and closing some other descriptor of the file releases nothing).
_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", None)
_FLOCK = struct.Struct("hhqqi4x")  # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)


def _forget_held_locks() -> None:
    # A child forked inside a path_lock holds nothing: the lock is its parent's.
    _held.__dict__.pop("locks", None)


os.register_at_fork(after_in_child=_forget_held_locks)


def _path_hash(rel: str) -> int:
    return int.from_bytes(hashlib.blake2b(rel.encode(), digest_size=4).digest(), "big")


def _lock_id(rel: str) -> int:
    """What is locked for ``rel``: its byte of the lock file, or its stripe where OFD locks are
    missing. Re-entrancy and the order of several locks go by this, so two paths that share a
    stripe are one lock (a thread taking both would otherwise wait on itself)."""
    h = _path_hash(rel)
    return h if _OFD_SETLKW is not None else h % LOCK_STRIPES


@contextmanager
def path_lock(root: Path, rel: str) -> Iterator[None]:
    """Hold the lock of one data path, against every thread and process using this root.

    One byte of ``.tether/locks/paths.lock``, at an offset hashed from the path, locked with an
    open file description lock: one file for every path, created once. Creating a file costs
    0.8 ms on this kind of disk, as much as the write it guards, so per-path or per-stripe lock
    files made a fresh root's first writes twice as slow. Where OFD locks are missing, a
    ``flock`` on one of ``LOCK_STRIPES`` lock files. Re-entrant within a thread, so a handler
    may hold the locks of several paths; take them in one order (``path_locks``) so two
    processes cannot wait on each other. Each acquisition opens its own descriptor, so threads
    of one process exclude each other too.
    """
    h = _lock_id(rel)
    key = (os.fspath(root), h)
    held: dict[tuple[str, int], int] = _held.__dict__.setdefault("locks", {})
    if key in held:
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    name = LOCK_FILE if _OFD_SETLKW is not None else f"{h:04d}.lock"
    fd = _open_lock_file(os.path.join(key[0], INTERNAL_DIR, "locks", name))
    try:
        if _OFD_SETLKW is not None:
            fcntl.fcntl(fd, _OFD_SETLKW, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, h, 1, 0))
        else:
            fcntl.flock(fd, fcntl.LOCK_EX)
        held[key] = 1
        try:
            yield
        finally:
            del held[key]
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _open_lock_file(path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


@contextmanager
def path_locks(root: Path, rels: list[str]) -> Iterator[None]:
    """The locks of several paths, taken in one global order."""
    with ExitStack() as stack:
        for rel in sorted(set(rels), key=_lock_id):
            stack.enter_context(path_lock(root, rel))
        yield


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unlink_quietly(path: str | os.PathLike[str]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
