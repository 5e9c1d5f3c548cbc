"""The data root: path checks, the one atomic write and delete (``DataFile``), per-path locks.

A reader of a data file sees the old complete file or the new complete file, never a torn one.
Every operation on data goes through a descriptor of its directory opened from the root without
following any symlink (``beneath``); only regular files are read or replaced. tether's own files
are the ``.tether/`` directory under the root and ``*.tether-tmp`` temp files; neither is ever
data, however it is reached.
"""

from __future__ import annotations

import errno
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

from . import beneath

INTERNAL_DIR = ".tether"
TEMP_SUFFIX = ".tether-tmp"

_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK
NAME_MAX = 255  # bytes in one path component (Linux, macOS, the BSDs)
PATH_MAX = 4095
# ``.<name>.<8 hex>.tether-tmp``: the temp file of a write of <name>, in the same directory.
TEMP_OVERHEAD = 1 + 1 + 8 + len(TEMP_SUFFIX)


class PathRejected(ValueError):
    """Why a relative path is not acceptable (the caller names the field and job type)."""


class NotRegularFile(OSError):
    """What is at a data path is not a regular file (a directory, FIFO, socket or device); tether
    reads and replaces only regular files. ``filename`` is the path, ``strerror`` what it is."""


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
    _check_internal(parts)
    _check_lengths(parts)
    return "/".join(parts)


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
    enqueue-time checks: operations on data go through ``data_file``, which follows no symlink."""
    return Path(_resolve(root, rel)[0])


def canonical(root: Path, rel: str) -> str:
    """The one name of the file ``rel`` names: its resolved path relative to the real root. Two
    spellings of one file (through a symlinked directory inside the root) share it, so they
    share one ordering key and one path lock. tether's own files are refused however they are
    reached (``ln -s .tether data/tl`` makes ``tl/locks/paths.lock`` no data path)."""
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
    for _ in range(3):
        try:
            target = os.path.realpath(os.path.join(real_root, norm))
            break
        except OSError as e:  # a symlink replaced by a directory between lstat and readlink
            if e.errno != errno.EINVAL:
                raise
    else:
        raise PathRejected("kept changing while it was resolved (a symlink swapped back and forth)")
    if target != real_root and not target.startswith(real_root + os.sep):
        raise PathRejected("resolves (through a symlink) outside the data root")
    if target == real_root:
        raise PathRejected("names the data root itself, not a file")
    rel = os.path.relpath(target, real_root).replace(os.sep, "/")
    try:
        _check_internal(rel.split("/"))
        _check_lengths(rel.split("/"))
    except PathRejected as e:
        raise PathRejected(f"resolves (through a symlink) to {rel!r}, which {e}") from None
    return target, rel


@lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    # The root is resolved once per process; paths under it are resolved on every call.
    return os.path.realpath(root)


_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_root(root: str | os.PathLike[str]) -> int:
    """A descriptor of the data root, opened for this operation (the caller closes it): the root
    is the operator's to choose (it may itself be a symlink); nothing below it is followed. Not
    cached: a root removed and made again must not leave writes going into the old, unlinked
    directory."""
    return os.open(_real_root(os.fspath(root)), _ROOT_FLAGS)


@contextmanager
def opened_root(root: str | os.PathLike[str]) -> Iterator[int]:
    """``open_root``, closed on exit."""
    fd = open_root(root)
    try:
        yield fd
    finally:
        os.close(fd)


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


@contextmanager
def data_file(
    root: str | os.PathLike[str], rel: str, *, create: bool = False, root_fd: int | None = None
) -> Iterator[DataFile]:
    """The data path ``rel`` (normalized) under ``root``, through a descriptor of its directory
    opened from the root (``root_fd``, or opened for this call) without following any symlink.
    With ``create``, missing directories are made. OSError names the component at fault
    (``filename``, relative to the root)."""
    directory, _, name = rel.rpartition("/")
    own = root_fd is None
    opened = open_root(root) if root_fd is None else root_fd
    try:
        dir_fd = beneath.open_dir(opened, directory, create=create)
    finally:
        if own:
            os.close(opened)
    try:
        yield DataFile(_real_root(os.fspath(root)), directory, name, dir_fd)
    finally:
        os.close(dir_fd)


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK  # never blocks on a FIFO swapped in after the lstat


class DataFile:
    """One data path, held by its directory's descriptor: every call acts inside that directory,
    whatever is renamed or swapped for a symlink above it meanwhile."""

    __slots__ = ("dir_fd", "directory", "name", "real_root", "rel")

    def __init__(self, real_root: str, directory: str, name: str, dir_fd: int) -> None:
        self.real_root, self.directory, self.name, self.dir_fd = real_root, directory, name, dir_fd
        self.rel = f"{directory}/{name}" if directory else name

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

    def holds(self, data: bytes, *, sync_dir: bool = True) -> bool:
        """Whether the regular file at the path holds exactly ``data``. When it does, it and its
        directory are fsynced before this returns: whoever wrote it (an earlier attempt of this
        job, say) may have seen its fsync fail, and the job must not complete on bytes that are
        only in the page cache. Without ``sync_dir`` the caller fsyncs the directory before the
        job is recorded (``jobtypes.dirsync``)."""
        try:
            fd = os.open(self.name, _READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise beneath._named(e, self.rel) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped since the lstat: check before any read
                raise _not_regular(st.st_mode, self.rel)
            if st.st_size != len(data) or not _reads_as(fd, data):
                return False
            fsync_fd(fd)
        finally:
            os.close(fd)
        if sync_dir:
            fsync_fd(self.dir_fd)
        return True

    def write(self, data: bytes, *, sync_dir: bool = True) -> None:
        """Replace the file with ``data`` all at once: temp file in the same directory, write,
        fsync, rename over the target, fsync the directory (without ``sync_dir``, the caller
        does that last step before the job is recorded: ``jobtypes.dirsync``). The first time
        this process writes into a directory it also makes the directories above it durable, up
        to the data root, before the rename. The temp file is removed on any error, which leaves
        the target as it was."""
        tmp = f".{self.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _FILE_MODE, dir_fd=self.dir_fd
        )
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                fsync_fd(fd)
            finally:
                os.close(fd)
            if self.directory and (self.real_root, self.directory) not in _durable_dirs:
                _make_durable(self.dir_fd, self.real_root, self.directory)
            os.replace(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException as e:
            _unlink_quietly(tmp, self.dir_fd)
            if isinstance(e, OSError) and e.filename is None:
                raise beneath._named(e, self.rel) from None
            raise
        if sync_dir:
            fsync_fd(self.dir_fd)

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
            raise beneath._named(e, self.rel) from None
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


def _reads_as(fd: int, data: bytes) -> bool:
    """Whether what is left of an open file is exactly ``data``, compared a chunk at a time: no
    second copy of a large file is held (a short read is the end, as asked for one byte more)."""
    view = memoryview(data)
    pos = 0
    while chunk := os.read(fd, min(_CHUNK, len(data) - pos + 1)):
        if view[pos : pos + len(chunk)] != chunk:
            return False
        pos += len(chunk)
    return pos == len(data)


_CHUNK = 1 << 20


def _read_all(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of an open file."""
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(limit - size, _CHUNK))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read(root: str | os.PathLike[str], rel: str) -> bytes:
    """The bytes of the regular data file ``rel`` (normalized), opened from the root without
    following any symlink and without blocking (a FIFO, socket or device is NotRegularFile)."""
    with opened_root(root) as root_fd:
        fd = beneath.open_beneath(root_fd, rel, _READ_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(st.st_mode, rel)
        return _read_all(fd, 1 << 62)
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
def path_lock(root: Path, rel: str, *, root_fd: int | None = None) -> Iterator[None]:
    """Hold the lock of one data path, against every thread and process using this root.

    One byte of ``.tether/locks/paths.lock``, at an offset hashed from the path, locked with an
    open file description lock: one file for every path, created once. Creating a file costs
    0.8 ms on this kind of disk, as much as the write it guards, so per-path or per-stripe lock
    files made a fresh root's first writes twice as slow. Where OFD locks are missing, a
    ``flock`` on one of ``LOCK_STRIPES`` lock files. Re-entrant within a thread, so a handler
    may hold the locks of several paths; take them in one order (``path_locks``) so two
    processes cannot wait on each other. Each acquisition opens its own descriptor, so threads
    of one process exclude each other too. ``root_fd``: the root, already open for the caller.
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
    fd = _open_lock_file(key[0], name, root_fd)
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


def _open_lock_file(root: str, name: str, root_fd: int | None = None) -> int:
    """``.tether/locks/<name>`` under the root (``root_fd`` if open already), following no
    symlink: a ``.tether`` that is a symlink is refused (ELOOP), never used to put the lock file
    outside the root."""
    if root_fd is None:
        with opened_root(root) as fd:
            return _open_lock_file(root, name, fd)
    rel = f"{INTERNAL_DIR}/locks/{name}"
    try:
        return beneath.open_beneath(root_fd, rel, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        os.close(beneath.open_dir(root_fd, f"{INTERNAL_DIR}/locks", create=True))
        return beneath.open_beneath(root_fd, rel, os.O_RDWR | os.O_CREAT, 0o644)


@contextmanager
def path_locks(root: Path, rels: list[str]) -> Iterator[None]:
    """The locks of several paths, taken in one global order."""
    with ExitStack() as stack:
        for rel in sorted(set(rels), key=_lock_id):
            stack.enter_context(path_lock(root, rel))
        yield


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
