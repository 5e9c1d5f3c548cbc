"""A data file read, replaced and removed atomically and durably (``DataFile``), and the root.

A reader of a data file sees the old complete file or the new complete file, never a torn one:
a write goes to a temp file in the same directory, is fsynced, renamed over the target, and the
directory fsynced. Every operation acts through a descriptor of the file's directory opened from
the root without following any symlink (``nofollow``); only regular files are read or replaced.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from random import getrandbits
from typing import NamedTuple

from . import nofollow
from .paths import TEMP_SUFFIX, real_root

_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK


class NotRegularFile(OSError):
    """What is at a data path is not a regular file (a directory, FIFO, socket or device); tether
    reads and replaces only regular files. ``filename`` is the path, ``strerror`` what it is."""


class Known(NamedTuple):
    """A data file whose bytes are known: its stat, and the realtime clock read just before that
    stat was taken (what a fingerprint records: ``fingerprint``)."""

    moment: int
    stat: os.stat_result


_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_root(root: str | os.PathLike[str]) -> int:
    """A descriptor of the data root, opened for this operation (the caller closes it): the root
    is the operator's to choose (it may itself be a symlink); nothing below it is followed. Not
    cached: a root removed and made again must not leave writes going into the old, unlinked
    directory."""
    return os.open(real_root(os.fspath(root)), _ROOT_FLAGS)


class _OpenedRoot:
    """``opened_root``'s context manager: a class rather than a generator, since every file job
    enters one and a generator's frame and wrapper cost several times its two calls."""

    __slots__ = ("_fd", "_root")

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = root
        self._fd = -1

    def __enter__(self) -> int:
        self._fd = open_root(self._root)
        return self._fd

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)


def opened_root(root: str | os.PathLike[str]) -> _OpenedRoot:
    """``open_root``, closed on exit (``with opened_root(root) as root_fd``)."""
    return _OpenedRoot(root)


# The directories (relative to their real data root) whose entries this process has made
# durable, each with every directory above it up to the root. A file is not durable until all of
# those are, and a directory another thread or process has just made may not be yet (its maker
# may still be on the way to fsyncing the parent; ext4 without a journal does not carry a mkdir
# along with a later fsync). Data roots count as durable: they exist before tether writes into
# them (see ``make_root``). A directory removed and made again by someone else while this
# process runs is taken as durable. An fsync that fails adds nothing, so the next write tries it
# again.
_durable_dirs: set[tuple[str, str]] = set()
_DURABLE_DIRS_MAX = 65_536  # past this the set starts again: forgetting costs only an fsync


def _make_durable(dir_fd: int, real_root: str, directory: str) -> None:
    """Make the entries of the directories on the way to ``directory`` (open as ``dir_fd``)
    durable, parent first, so the set never holds a directory whose parents are not durable yet.
    The parents are reached by ``..`` from the directory itself, not by name again: they are the
    ones the file is really written under, whatever was renamed meanwhile."""
    if len(_durable_dirs) > _DURABLE_DIRS_MAX:
        _durable_dirs.clear()
    parts = directory.split("/")
    ancestors = [dir_fd]  # ancestors[j]: the directory j levels above ``directory``
    try:
        for _ in parts:
            ancestors.append(os.open("..", _ROOT_FLAGS, dir_fd=ancestors[-1]))
        for depth in range(len(parts)):
            key = (real_root, "/".join(parts[: depth + 1]))
            if key not in _durable_dirs:
                fsync_fd(ancestors[len(parts) - depth])  # the parent of the directory at depth + 1
                _durable_dirs.add(key)
    finally:
        for fd in ancestors[1:]:
            os.close(fd)


def fsync_fd(fd: int) -> None:
    """fsync one descriptor (a module attribute, so a test can make it fail)."""
    os.fsync(fd)


def data_file(root: str | os.PathLike[str], rel: str, *, create: bool = False, root_fd: int | None = None) -> DataFile:
    """The data path ``rel`` (normalized) under ``root``, through a descriptor of its directory
    opened from the root (``root_fd``, or opened for this call) without following any symlink,
    for a ``with`` statement, which closes that descriptor. With ``create``, missing directories
    are made. OSError names the component at fault (``filename``, relative to the root)."""
    directory, _, name = rel.rpartition("/")
    top = real_root(os.fspath(root))
    if root_fd is None:
        with opened_root(root) as opened:
            dir_fd = nofollow.open_dir(opened, directory, create=create)
    else:
        dir_fd = nofollow.open_dir(root_fd, directory, create=create)
    return DataFile(top, directory, name, dir_fd)


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK  # never blocks on a FIFO swapped in after the lstat


class DataFile:
    """One data path, held by its directory's descriptor: every call acts inside that directory,
    whatever is renamed or swapped for a symlink above it meanwhile. Made by ``data_file``; the
    descriptor is closed when the ``with`` statement it was made for ends."""

    __slots__ = ("dir_fd", "directory", "name", "real_root", "rel")

    def __init__(self, real_root: str, directory: str, name: str, dir_fd: int) -> None:
        self.real_root, self.directory, self.name, self.dir_fd = real_root, directory, name, dir_fd
        self.rel = f"{directory}/{name}" if directory else name

    def __enter__(self) -> DataFile:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.dir_fd)

    def lstat(self) -> os.stat_result | None:
        """What is at the path (a symlink itself, not followed), None if nothing."""
        try:
            return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def regular(self) -> os.stat_result | None:
        """``lstat``, refusing anything but a regular file (NotRegularFile, ELOOP for a symlink)."""
        st = self.lstat()
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise _not_regular(st.st_mode, self.rel)
        return st

    def holds(self, data: bytes, *, sync_dir: bool = True) -> Known | None:
        """Whether the regular file at the path holds exactly ``data``: when it does, the moment
        and stat of the file read (``Known``; None when it does not). When it does, it and its
        directory are fsynced before this returns: whoever wrote it (an earlier attempt of this
        job, say) may have seen its fsync fail, and the job must not complete on bytes that are
        only in the page cache. Without ``sync_dir`` the caller fsyncs the directory before the
        job is recorded (``dirsync``)."""
        try:
            fd = os.open(self.name, _READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise nofollow.named(e, self.rel) from None
        try:
            moment = time.time_ns()
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped since the lstat: check before any read
                raise _not_regular(st.st_mode, self.rel)
            if st.st_size != len(data) or not reads_as(fd, data):
                return None
            fsync_fd(fd)
        finally:
            os.close(fd)
        if sync_dir:
            fsync_fd(self.dir_fd)
        return Known(moment, st)

    def write(self, data: bytes, *, sync_dir: bool = True) -> Known:
        """Replace the file with ``data`` all at once: temp file in the same directory, write,
        fsync, rename over the target, fsync the directory (without ``sync_dir``, the caller
        does that last step before the job is recorded: ``dirsync``). The first time
        this process writes into a directory it also makes the directories above it durable, up
        to the data root, before the rename. The temp file is removed on any error, which leaves
        the target as it was. Returns the moment and stat of the file written, taken after the
        rename (which stamps its ctime on some file systems) on the descriptor written through."""
        # The temp name need only differ from a temp file a dead writer of this path left (no
        # live one can be here: the caller holds the path's lock); O_EXCL refuses a name taken, the
        # attempt is retried, and a re-run removes such files first. So the process's generator,
        # seeded from the OS (and again in a forked child), without a system call a file.
        tmp = f".{self.name}.{getrandbits(32):08x}{TEMP_SUFFIX}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _FILE_MODE, dir_fd=self.dir_fd
        )
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                fsync_fd(fd)
                if self.directory and (self.real_root, self.directory) not in _durable_dirs:
                    _make_durable(self.dir_fd, self.real_root, self.directory)
                os.replace(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                known = Known(time.time_ns(), os.fstat(fd))
            finally:
                os.close(fd)
        except BaseException as e:
            _unlink_quietly(tmp, self.dir_fd)
            if isinstance(e, OSError) and e.filename is None:
                raise nofollow.named(e, self.rel) from None
            raise
        if sync_dir:
            fsync_fd(self.dir_fd)
        return known

    def delete(self, *, sync_dir: bool = True) -> bool:
        """Remove the file durably; False if it was not there. The directory is fsynced either
        way (without ``sync_dir``, by the caller before the job is recorded): an earlier attempt
        may have removed it and then failed to fsync."""
        try:
            os.unlink(self.name, dir_fd=self.dir_fd)
            deleted = True
        except FileNotFoundError:
            deleted = False
        except OSError as e:
            if e.errno in (errno.EISDIR, errno.EPERM) and (st := self.lstat()) and stat.S_ISDIR(st.st_mode):
                raise _not_regular(st.st_mode, self.rel) from None
            raise nofollow.named(e, self.rel) from None
        if sync_dir:
            fsync_fd(self.dir_fd)
        return deleted

    def remove_stale_temps(self) -> int:
        """Remove temp files left for this path by interrupted writes. Call only while holding the
        path's lock, so no live write of this path owns one of them."""
        removed = 0
        prefix = f".{self.name}."
        with os.scandir(self.dir_fd) as entries:
            for entry in entries:
                name = entry.name
                if (
                    name.startswith(prefix)
                    and name.endswith(TEMP_SUFFIX)
                    and len(name) == len(prefix) + 8 + len(TEMP_SUFFIX)
                    and not entry.is_dir(follow_symlinks=False)
                ):
                    _unlink_quietly(name, self.dir_fd)
                    removed += 1
        return removed


def _not_regular(mode: int, rel: str) -> OSError:
    if stat.S_ISLNK(mode):
        return OSError(errno.ELOOP, "is a symbolic link", rel)
    return NotRegularFile(errno.EINVAL, "is a directory" if stat.S_ISDIR(mode) else "is not a regular file", rel)


def reads_as(fd: int, data: bytes) -> bool:
    """Whether what is left of an open file is exactly ``data``, compared a chunk at a time: no
    second copy of a large file is held (a short read is the end, as asked for one byte more)."""
    view = memoryview(data)
    pos = 0
    while chunk := os.read(fd, min(CHUNK, len(data) - pos + 1)):
        if view[pos : pos + len(chunk)] != chunk:
            return False
        pos += len(chunk)
    return pos == len(data)


CHUNK = 1 << 20


def _read_all(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of an open file."""
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(limit - size, CHUNK))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read(root: str | os.PathLike[str], rel: str) -> bytes:
    """The bytes of the regular data file ``rel`` (normalized), opened from the root without
    following any symlink and without blocking (a FIFO, socket or device is NotRegularFile)."""
    return read_known(root, rel)[0]


def read_known(root: str | os.PathLike[str], rel: str) -> tuple[bytes, Known]:
    """``read``, with the moment and stat of the file read, taken before the read."""
    with opened_root(root) as root_fd:
        fd = nofollow.open_beneath(root_fd, rel, _READ_FLAGS)
    try:
        moment = time.time_ns()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(st.st_mode, rel)
        return _read_all(fd, 1 << 62), Known(moment, st)
    finally:
        os.close(fd)


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


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
