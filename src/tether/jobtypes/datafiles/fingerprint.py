"""Fingerprints of data files: what a stat says about a file whose bytes are known to be a job's,
so that a content check reads only the files whose stat has changed since.

A fingerprint is the file's device, inode, size, mtime_ns and ctime_ns (five 64-bit integers,
little-endian, as hex text: made without formatting decimal numbers, a good part of a check's
time per file otherwise), from a stat taken when its bytes were known to be the job's (just
written under its path's lock, or just read and compared by a check). Any write to a file
changes its ctime, which no user can set (``touch`` and ``utime`` set only the mtime, and stamp
the ctime themselves); a file replaced by another has another inode. So a stat that still reads
as the fingerprint says the bytes are the ones that were known, with one exception, what git
calls "racily clean":

A file system stamps ctime from a clock that advances one tick at a time (Linux: the coarse
realtime clock, one scheduler tick; file systems that keep whole seconds: a second or two). A
write within the tick of a ctime leaves the ctime as it was. Every write after a moment ``t``
has a ctime past ``t - tick``; so when the stat was taken at least a tick past the file's ctime
(``t`` the realtime clock read just before the stat), no later write can leave the stat as it
was. A stat taken closer than that (the common case at a job's completion, whose stat follows its
write by microseconds) is racily clean and recorded as no fingerprint: the check reads the file,
and when it holds the job's bytes records a fingerprint of the stat it took before that read,
if that one is a tick past its ctime (``reconcile``). So the rule is applied once, when a
fingerprint is recorded, and a check compares text.

The tick (``grain_ns``): the coarse realtime clock's resolution on Linux (the clock the kernel
stamps files with; fine-grained stamps are never coarser), two seconds elsewhere and for any
ctime without a sub-second part (FAT keeps two seconds, ext3-era inodes and HFS+ whole seconds).
What a fingerprint cannot see: the system clock stepped backwards between a write and the next,
and a network file system stamped by a server whose clock runs behind this machine's; ``reconcile
--full`` reads every file.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import eq
from pathlib import Path
from stat import S_ISREG

from . import durable, existence, nofollow
from .durable import Known
from .existence import may_escape, outside

Matches = Callable[[int, list[str], list[str | None]], list[bool]]
matches_in_c: Matches | None
try:  # the common case's stats and comparisons, in C where it was built (``_stamps.c``)
    from ._stamps import matches as matches_in_c
except ImportError:
    matches_in_c = None

_SECOND = 1_000_000_000
COARSE_NS = 2 * _SECOND  # the tick of a file system that keeps seconds (FAT: two)
_CLOCK_REALTIME_COARSE = 5  # linux/time.h (Python's time module does not name it)


def _tick_ns() -> int:
    """The tick of the clock that stamps files here (see the module's docstring)."""
    if sys.platform != "linux":
        return COARSE_NS
    try:
        return max(1, round(time.clock_getres(_CLOCK_REALTIME_COARSE) * _SECOND))
    except OSError:
        return COARSE_NS


TICK_NS = _tick_ns()


def grain_ns(ctime_ns: int) -> int:
    """The tick within which a write may leave ``ctime_ns`` unchanged."""
    return TICK_NS if ctime_ns % _SECOND else COARSE_NS


_PACK = struct.Struct("<QQqqq").pack


def stamp(st: os.stat_result) -> str | None:
    """A stat as a fingerprint's text; None for one that does not fit (a time past 2262)."""
    try:
        return _PACK(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns).hex()
    except struct.error:
        return None


def of(known: Known) -> str | None:
    """The fingerprint of a file whose bytes are known, or None when its stat was taken within a
    tick of its ctime (racily clean). The moment is the realtime clock's (``time.time_ns``), the
    one the kernel stamps files with, never an application's clock: a test's fake time would make
    every fingerprint trusted."""
    st = known.stat
    if known.moment - st.st_ctime_ns < grain_ns(st.st_ctime_ns):
        return None
    return stamp(st)


def compare(
    root: Path, rels: Sequence[str | None], recorded: Sequence[str | None]
) -> tuple[list[bool], list[str | None]]:
    """For each data path (None: no file to look at), whether its stat reads as its recorded
    fingerprint; and for those that do not, the fingerprint to record if a read that follows
    finds the job's bytes (``of`` the stat taken here: None when racily clean, not a regular
    file, or not reached). Each directory is opened once from the root, following no symlink,
    and its files are stat'ed and compared in one call of the C module (``_stamps.c``), without
    the interpreter's lock; those it does not find the same, or all where it is not built, are
    stat'ed, stamped and compared a column at a time in Python (per file, a Python statement
    would be most of this check's time besides the stat)."""
    same = [False] * len(rels)
    fresh: list[str | None] = [None] * len(rels)
    unnamed = None in rels
    paths: Sequence[str] = [rel or "" for rel in rels] if unnamed else rels  # type: ignore[assignment]
    dirs, names = existence.split_paths(paths)
    if unnamed or may_escape(paths):  # only then, one by one
        for n, rel in enumerate(rels):
            if rel is None or outside(rel):
                dirs[n] = None
    moment = time.time_ns()  # before every stat below: see the module's docstring
    try:
        root_fd = durable.open_root(root)
    except OSError:
        return same, fresh  # nothing reached: every file is read, and the read says why
    try:
        for directory, spans in existence.directory_runs(dirs).items():
            try:
                dir_fd = nofollow.open_dir(root_fd, directory)
            except OSError:
                continue
            try:
                _compare_in(dir_fd, existence.positions(spans), names, recorded, moment, same, fresh)
            finally:
                os.close(dir_fd)
    finally:
        os.close(root_fd)
    return same, fresh


def _compare_in(
    dir_fd: int,
    indexes: Sequence[int],
    names: list[str],
    recorded: Sequence[str | None],
    moment: int,
    same: list[bool],
    fresh: list[str | None],
) -> None:
    """``compare`` for the paths at ``indexes``, all in the open directory ``dir_fd``: those the C
    module finds the same are decided by it (it only ever says "same"); the others, or all where
    it is not built, by the stats below, which also make the fingerprints to record."""
    if isinstance(indexes, range):
        mine, known = names[indexes.start : indexes.stop], recorded[indexes.start : indexes.stop]
    else:
        mine, known = [names[n] for n in indexes], [recorded[n] for n in indexes]
    if matches_in_c is not None:
        found = matches_in_c(dir_fd, mine, known if isinstance(known, list) else list(known))
        _set(same, indexes, found)
        if all(found):
            return
        indexes = [n for n, match in zip(indexes, found, strict=True) if not match]
        mine, known = [names[n] for n in indexes], [recorded[n] for n in indexes]
    stats = _stats(mine, dir_fd)
    try:  # inline ``stamp`` (a call per file costs as much as the stamp)
        stamps: list[str] = [
            _PACK(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns).hex()  # type: ignore[union-attr]
            for st in stats
        ]
    except (AttributeError, struct.error):  # a file not reached (None), or a time past 2262
        # "": matches no recorded fingerprint, not even a missing one (None)
        stamps = ["" if st is None else stamp(st) or "" for st in stats]
    matched = list(map(eq, stamps, known))
    _set(same, indexes, matched)
    if all(matched):
        return
    for n, st, text, match in zip(indexes, stats, stamps, matched, strict=True):
        if match or not text:
            continue
        assert st is not None  # a stamp was made of it
        ctime = st.st_ctime_ns
        if moment - ctime >= grain_ns(ctime) and S_ISREG(st.st_mode):
            fresh[n] = text


def _set(same: list[bool], indexes: Sequence[int], matched: list[bool]) -> None:
    if isinstance(indexes, range):
        same[indexes.start : indexes.stop] = matched
    else:
        for n, match in zip(indexes, matched, strict=True):
            same[n] = match


def _stats(names: list[str], dir_fd: int) -> list[os.stat_result | None]:
    """The lstat of each name in the open directory (None where it failed: the read that follows
    says why)."""
    lstat = existence.lstat_data_file  # looked up per call: a test swaps in a fake that fails
    try:
        return list(map(lstat, names, repeat(dir_fd)))
    except OSError:
        return [_stat_or_none(lstat, name, dir_fd) for name in names]


def _stat_or_none(lstat: Callable[[str, int], os.stat_result], name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return lstat(name, dir_fd)
    except OSError:
        return None
