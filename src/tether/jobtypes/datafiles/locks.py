"""Per-path locks: one data path is changed by one thread of one process at a time.

The lock of a path is one byte of ``.tether/locks/paths.lock`` under the root, at an offset hashed
from the path's canonical name, held with an open file description lock: one file for every path,
made once. Where those locks are missing, ``flock`` on one of ``LOCK_STRIPES`` lock files.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct
import threading
from pathlib import Path

from . import nofollow
from .durable import opened_root
from .paths import INTERNAL_DIR

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
    missing. Re-entrancy goes by this, so two paths that share a stripe are one lock (a thread
    taking both would otherwise wait on itself)."""
    h = _path_hash(rel)
    return h if _OFD_SETLKW is not None else h % LOCK_STRIPES


def path_lock(root: Path, rel: str, *, root_fd: int | None = None) -> PathLock:
    """Hold the lock of one data path, against every thread and process using this root
    (``with path_lock(root, rel):``).

    One byte of ``.tether/locks/paths.lock``, at an offset hashed from the path, locked with an
    open file description lock: one file for every path, made once, since making a file costs as
    much as the write it guards. Where OFD locks are missing, a ``flock`` on one of
    ``LOCK_STRIPES`` lock files.
    Re-entrant within a thread, so code holding a path's lock may call ``write_locked`` on it.
    Each acquisition opens its own descriptor, so threads of one process exclude each other too.
    ``root_fd``: the root, already open for the caller.
    """
    return PathLock(root, rel, root_fd)


class PathLock:
    """``path_lock``'s context manager: a class rather than a generator, since every file job
    takes one and a generator's frame and wrapper cost several times its two calls."""

    __slots__ = ("_fd", "_held", "_key", "_root_fd")
    _held: dict[tuple[str, int], int]

    def __init__(self, root: Path, rel: str, root_fd: int | None) -> None:
        self._key = (os.fspath(root), _lock_id(rel))
        self._root_fd = root_fd
        self._fd = -1  # this acquisition's descriptor; -1 while re-entered (an outer one holds it)

    def __enter__(self) -> None:
        key = self._key
        # The thread's count, kept for ``__exit__``: a child forked meanwhile starts a count of its own.
        held = self._held = _held.__dict__.setdefault("locks", {})
        if key in held:
            held[key] += 1
            return
        h = key[1]
        fd = _open_lock_file(key[0], LOCK_FILE if _OFD_SETLKW is not None else f"{h:04d}.lock", self._root_fd)
        try:
            if _OFD_SETLKW is not None:
                fcntl.fcntl(fd, _OFD_SETLKW, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, h, 1, 0))
            else:
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        held[key] = 1
        self._fd = fd

    def __exit__(self, *exc: object) -> None:
        held = self._held
        if self._fd < 0:
            held[self._key] -= 1
            return
        try:
            del held[self._key]
        finally:
            os.close(self._fd)  # closing the descriptor releases the lock


def _open_lock_file(root: str, name: str, root_fd: int | None = None) -> int:
    """``.tether/locks/<name>`` under the root (``root_fd`` if open already), following no
    symlink: a ``.tether`` that is a symlink is refused (ELOOP), never used to put the lock file
    outside the root."""
    if root_fd is None:
        with opened_root(root) as fd:
            return _open_lock_file(root, name, fd)
    rel = f"{INTERNAL_DIR}/locks/{name}"
    try:
        return nofollow.open_beneath(root_fd, rel, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        os.close(nofollow.open_dir(root_fd, f"{INTERNAL_DIR}/locks", create=True))
        return nofollow.open_beneath(root_fd, rel, os.O_RDWR | os.O_CREAT, 0o644)
