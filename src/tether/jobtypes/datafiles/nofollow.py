"""Opening a path beneath a data root without ever following a symlink on the way.

Every open of data starts from a descriptor of the root and goes down one component at a time
(``O_NOFOLLOW | O_DIRECTORY``, each relative to the last), or in one Linux ``openat2`` call with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``; the final open, rename, unlink or fsync then uses the
directory's descriptor (``dir_fd=``). A directory swapped for a symlink between a check and a
use makes the use fail with ELOOP instead of acting outside the root. The model is Go 1.24's
``os.Root``; like it, a directory that someone *moves* out of the root while tether holds it open
is followed there (that needs write access outside the root, which a hostile writer inside the
root does not have).

Errors are ``OSError`` whose ``filename`` is the path, relative to the root, of the component at
fault (``a.json`` for ``a.json/b.json`` when ``a.json`` is a file), so a message can name it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from typing import Any

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# openat2(2): Linux 5.6+. RESOLVE_NO_SYMLINKS refuses a symlink anywhere on the path (ELOOP), the
# final component included; RESOLVE_BENEATH refuses anything that would leave the directory.
# The same number on every architecture (the syscall table was unified first), as the C long it is.
_SYS_OPENAT2 = ctypes.c_long(437)
_RESOLVE = 0x04 | 0x08  # RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load_openat2() -> Any:
    if sys.platform != "linux" or os.environ.get("TETHER_NO_OPENAT2"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    # No argtypes: each call passes what the system call takes (the number and the size as C
    # values made once, the descriptor a C int, the path bytes, the struct a pointer), since
    # converting five arguments through argtypes costs ctypes more than the rest of the call.
    return call


_syscall = _load_openat2()
_HOW_SIZE = ctypes.c_size_t(ctypes.sizeof(_OpenHow))
_usable: bool | None = None  # found out on first use
_hows: dict[tuple[int, int], Any] = {}  # (flags, mode) -> pointer to its struct open_how


def _openat2(dir_fd: int, rel: str, flags: int, mode: int) -> int:
    """openat2 beneath ``dir_fd``, or -1 when the portable walk must answer: no openat2 here, a
    rename raced the lookup (EAGAIN, EXDEV), or a component is a file or a symlink (the walk
    names which)."""
    global _usable
    if _usable is None:
        _usable = _try_openat2(dir_fd)
    if not _usable:
        return -1
    how = _hows.get((flags, mode))
    if how is None:  # a handful of (flags, mode) pairs in all: each struct is built once
        how = _hows[flags, mode] = ctypes.pointer(_OpenHow(flags, mode if flags & os.O_CREAT else 0, _RESOLVE))
    fd = _syscall(_SYS_OPENAT2, dir_fd, os.fsencode(rel), how, _HOW_SIZE)
    if fd >= 0:
        return int(fd)
    code = ctypes.get_errno()
    if code in _WALK_ANSWERS:
        return -1
    raise OSError(code, os.strerror(code), rel)


_WALK_ANSWERS = frozenset((errno.EAGAIN, errno.EXDEV, errno.ENOTDIR, errno.ELOOP))


def _try_openat2(dir_fd: int) -> bool:
    """Whether openat2 works here (an old kernel says ENOSYS, a seccomp filter EPERM)."""
    if _syscall is None:
        return False
    how = _OpenHow(DIR_FLAGS, 0, _RESOLVE)
    fd = _syscall(_SYS_OPENAT2, dir_fd, b".", ctypes.byref(how), _HOW_SIZE)
    if fd < 0:
        return False
    os.close(fd)
    return True


def open_beneath(root_fd: int, rel: str, flags: int, mode: int = 0o666) -> int:
    """Open ``rel`` (normalized: no ``.``, ``..`` or empty component) beneath the directory
    ``root_fd``, following no symlink, the final component included (ELOOP)."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    fd = _openat2(root_fd, rel, flags, mode)
    if fd >= 0:
        return fd
    directory, _, name = rel.rpartition("/")
    dir_fd = open_dir(root_fd, directory) if directory else root_fd
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as e:
        raise named(e, rel) from None
    finally:
        if dir_fd != root_fd:
            os.close(dir_fd)


def open_dir(root_fd: int, rel: str, *, create: bool = False, made: list[str] | None = None) -> int:
    """A new descriptor of the directory ``rel`` beneath ``root_fd`` ("" is the root itself).
    With ``create``, missing directories are made (their relative paths appended to ``made``)."""
    if not rel:
        return os.dup(root_fd)
    if "/" not in rel:  # one component: the walk is one open, cheaper than openat2 through ctypes
        return walk(root_fd, rel, create=create, made=made)[0]
    try:
        fd = _openat2(root_fd, rel, DIR_FLAGS, 0)
    except FileNotFoundError:
        if not create:
            raise
        fd = -1
    if fd >= 0:
        return fd
    fds = walk(root_fd, rel, create=create, made=made)
    for f in fds[:-1]:
        os.close(f)
    return fds[-1]


def walk(root_fd: int, rel: str, *, create: bool = False, made: list[str] | None = None) -> list[int]:
    """The portable walk: one ``O_NOFOLLOW | O_DIRECTORY`` open per component of ``rel``, each
    relative to the one before. Returns every level's descriptor, the root's not included; the
    caller closes them."""
    fds: list[int] = []
    done = ""
    try:
        for part in rel.split("/"):
            done = f"{done}/{part}" if done else part
            parent = fds[-1] if fds else root_fd
            try:
                fds.append(os.open(part, DIR_FLAGS, dir_fd=parent))
                continue
            except FileNotFoundError as e:
                if not create:
                    raise named(e, done) from None
            except OSError as e:
                raise _classified(e, part, parent, done) from None
            try:
                os.mkdir(part, 0o777, dir_fd=parent)
                if made is not None:
                    made.append(done)
            except FileExistsError:
                pass  # made meanwhile by another writer: open it below, still following no symlink
            except OSError as e:
                raise named(e, done) from None
            try:
                fds.append(os.open(part, DIR_FLAGS, dir_fd=parent))
            except OSError as e:
                raise _classified(e, part, parent, done) from None
    except BaseException:
        for f in fds:
            os.close(f)
        raise
    return fds


def named(e: OSError, rel: str) -> OSError:
    """``e`` naming ``rel``."""
    return OSError(e.errno, e.strerror, rel)


def _classified(e: OSError, part: str, parent: int, rel: str) -> OSError:
    """``e`` naming ``rel``. A symlink opened with O_DIRECTORY | O_NOFOLLOW fails with ENOTDIR
    (Linux checks O_DIRECTORY first): say ELOOP when it is one, and EAGAIN (retryable) when it
    is a directory again by now, swapped back and forth while it was opened."""
    if e.errno == errno.ENOTDIR:
        try:
            mode = os.stat(part, dir_fd=parent, follow_symlinks=False).st_mode
        except OSError:
            return named(e, rel)
        if stat.S_ISLNK(mode):
            return OSError(errno.ELOOP, "is a symbolic link", rel)
        if stat.S_ISDIR(mode):
            return OSError(errno.EAGAIN, "changed while it was being opened", rel)
    return named(e, rel)
