"""The content probe of data files: does each hold exactly the bytes its job wrote.

Size first, bytes only when the sizes agree, a hash only when the bytes differ; only a regular
file is read (found by ``fstat`` of a non-blocking open, before any read).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from ..base import MISSING, MODIFIED, SYNCED, UNKNOWN, Check, differences_of, file_facts
from . import durable, nofollow
from .durable import CHUNK
from .existence import ABSENT, OUTSIDE, kind_of, outside, reason_of, through_link

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_noatime = getattr(os, "O_NOATIME", 0)


def open_data_file(dir_fd: int, name: str) -> int:
    """Open a data file to check it: in its directory (opened from the root without following
    symlinks), read-only, not through a symlink (ELOOP), never blocking on a FIFO, and without
    touching its access time where the OS allows (O_NOATIME needs ownership). A module
    attribute, so a test can swap in a fake that fails."""
    global _noatime
    if _noatime:
        try:
            return os.open(name, _OPEN_FLAGS | _noatime, dir_fd=dir_fd)
        except PermissionError as e:
            if e.errno != errno.EPERM:
                raise
            _noatime = 0
    return os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)


def check_file(root: Path, rel: str, expected: bytes) -> Check:
    """Check that one data file holds exactly ``expected``: size first, bytes only when the sizes
    agree, a hash only when the bytes differ. Only a regular file is read (found by fstat of a
    non-blocking open, before any read)."""
    return check_files(root, [(rel, expected)])[0]


def check_files(root: Path, items: Iterable[tuple[str, bytes]]) -> list[Check]:
    """``check_file`` for several ``(path, expected bytes)``: the root is opened once, and each
    directory once for the paths in it (up to ``_DIRS_OPEN`` directories held at a time). The
    items are taken one at a time: a generator that renders each expectation as it is asked
    keeps a file's bytes and its expectation in the CPU's caches together, which a content check
    needs more than a page's expectations rendered first (``benchmarks/reconcile.py``)."""
    out: list[Check] = []
    opened: dict[str, int | OSError] = {}
    try:
        root_fd = durable.open_root(root)
    except OSError as e:  # the root itself could not be opened: nothing under it can be checked
        return [OUTSIDE if outside(rel) else Check(UNKNOWN, detail=reason_of(e)) for rel, _ in items]
    last_directory: str | None = None
    dir_fd: int | OSError = 0
    try:
        for rel, expected in items:
            if outside(rel):
                out.append(OUTSIDE)
                continue
            directory, _, name = rel.rpartition("/")
            if directory != last_directory:  # a check's paths come sorted: mostly the last one
                found = opened.get(directory)
                if found is None:
                    if len(opened) >= _DIRS_OPEN:
                        _close_all(opened)
                    found = opened[directory] = _open_dir(root_fd, directory)
                dir_fd, last_directory = found, directory
            if isinstance(dir_fd, OSError):
                out.append(_unopened(dir_fd, expected, through_link(dir_fd.filename)))
                continue
            # The common file: regular, of the expected size, one read, the same bytes (inline:
            # a Python call per file is a good part of a content check).
            try:
                fd = open_data_file(dir_fd, name)
            except OSError as e:
                out.append(_unopened(e, expected, "is a symbolic link"))
                continue
            try:
                st = os.fstat(fd)
                size = len(expected)
                if st.st_size == size < CHUNK and stat.S_ISREG(st.st_mode) and os.read(fd, size + 1) == expected:
                    out.append(SYNCED)
                else:
                    out.append(_compared(fd, st, expected))
            except OSError as e:
                out.append(Check(UNKNOWN, detail=reason_of(e)))
            finally:
                os.close(fd)
    finally:
        _close_all(opened)
        os.close(root_fd)
    return out


_DIRS_OPEN = 64


def _close_all(opened: dict[str, int | OSError]) -> None:
    for fd in opened.values():
        if isinstance(fd, int):
            os.close(fd)
    opened.clear()


def _open_dir(root_fd: int, directory: str) -> int | OSError:
    try:
        return nofollow.open_dir(root_fd, directory)
    except OSError as e:
        return e


def _unopened(e: OSError, expected: bytes, link: str) -> Check:
    """The answer for a data file that could not be opened, or whose directory could not be:
    ``link`` says what a symlink met on the way (ELOOP) was."""
    if e.errno in ABSENT:
        return with_expected(Check(MISSING), expected)
    if e.errno == errno.ELOOP:
        return with_expected(Check(MODIFIED, detail=link), expected)
    return Check(UNKNOWN, detail=reason_of(e))


def _compared(fd: int, st: os.stat_result, expected: bytes) -> Check:
    """The answer for an open data file that is not the common one (``check_files``): not a
    regular file, another size, or bytes that differ."""
    if not stat.S_ISREG(st.st_mode):
        return with_expected(Check(MODIFIED, detail=kind_of(st.st_mode)), expected)
    if st.st_size != len(expected):
        return with_expected(Check(MODIFIED, actual=file_facts(st.st_size)), expected)
    os.lseek(fd, 0, os.SEEK_SET)  # from the start again: ``check_files`` may have read the first bytes
    actual = _differs(fd, expected)
    if actual is None:
        return SYNCED
    return with_expected(Check(MODIFIED, actual=file_facts(actual[0], actual[1])), expected)


def _differs(fd: int, expected: bytes) -> tuple[int, str] | None:
    """None when the open file holds exactly ``expected``; else its (size, sha256). The common
    case is one read and one comparison: no hashing."""
    if durable.reads_as(fd, expected):
        return None
    # Different bytes: hash what the file holds, from the start, for the report.
    os.lseek(fd, 0, os.SEEK_SET)
    digest, size = hashlib.sha256(), 0
    while chunk := os.read(fd, CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def with_expected(check: Check, expected: bytes | None) -> Check:
    if expected is None:
        return check
    facts = file_facts(len(expected), durable.sha256(expected))
    return replace(check, expected=facts, differences=differences_of(facts, check.actual))
