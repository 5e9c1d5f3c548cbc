"""The existence probe of data files: is each path a regular file (or absent), nothing read.

Also what the file probes share: how an entry that is not a regular file, or cannot be reached,
reads as a ``Check``, and ``file_paths``, the data paths of file jobs from their targets.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from contextvars import ContextVar
from itertools import groupby
from operator import itemgetter, methodcaller
from pathlib import Path

import orjson

from ..base import MISSING, MODIFIED, SYNCED, UNEXPECTED, UNKNOWN, Check, file_facts
from ..target import file_key
from . import durable, nofollow
from .paths import TEMP_SUFFIX

# Absent: no such entry, or a parent is not a directory (so the file cannot exist).
ABSENT = (errno.ENOENT, errno.ENOTDIR)


def lstat_data_file(name: str, dir_fd: int) -> os.stat_result:
    """What is at ``name`` in the open directory ``dir_fd``, not followed if a symlink. A module
    attribute, as ``list_data_dir`` is, so a test can swap in a fake that fails (tests run as
    root, where a chmod 000 file is still readable)."""
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


OUTSIDE = Check(UNKNOWN, detail="the ledger names a path outside the data root")
_MISSING = Check(MISSING)


def outside(rel: str) -> bool:
    """Whether a path the ledger names would leave the data root (a hand-edited row, say)."""
    return rel.startswith("/") or "\x00" in rel or (".." in rel and ".." in rel.split("/"))


# A directory holding at least this many of a batch's paths is listed once instead of one lstat
# per path (one getdents for many stats); fewer, and a listing costs more than it saves. And only
# when those paths are a good part of it (directory st_size is ~ 20-40 bytes per entry): a huge
# flat directory would be read whole for every batch.
_LIST_AT = 8
_BYTES_PER_WANTED = 64
_REGULAR, _DIRECTORY, _OTHER = 0, 1, 2


# Set by the reconciler for one check: directory -> (temp file names, subdirectory names) of
# every directory a probe listed in full, so the check's walk for leftover temp files does not
# list it again (reading a directory is most of that walk's cost).
listings: ContextVar[dict[str, tuple[list[str], list[str]]] | None] = ContextVar("tether_listings", default=None)


def list_data_dir(path: str, wanted: set[str], dir_fd: int) -> dict[str, int] | None:
    """Of the ``wanted`` names in the open directory ``dir_fd`` (at ``path``), those present ->
    what each is (_REGULAR, _DIRECTORY, _OTHER, from d_type, no stat); None when listing it does
    not pay or fails (the caller then uses lstat). Holds no more than the directory's names
    while it runs (and, during a check, keeps its temp files and subdirectories)."""
    try:
        if len(wanted) * _BYTES_PER_WANTED < os.fstat(dir_fd).st_size:
            return None
        with os.scandir(dir_fd) as listing:
            entries = list(listing)
        # The common directory holds only regular files: they are found by a comprehension and
        # set operations in C; the rest (subdirectories, links, FIFOs) in a pass over those alone.
        regular = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        found = dict.fromkeys(wanted.intersection(regular), _REGULAR)
        subdirs: list[str] = []
        temps = [n for n in regular if n.endswith(TEMP_SUFFIX)] if TEMP_SUFFIX in "/".join(regular) else []
        if len(regular) < len(entries):
            is_regular = set(regular)
            for e in entries:
                name = e.name
                if name in is_regular:
                    continue
                kind = _entry_kind(e)
                if name in wanted:
                    found[name] = kind
                if kind == _DIRECTORY:
                    subdirs.append(name)  # a data directory named ``x.tether-tmp`` is no temp file
                elif name.endswith(TEMP_SUFFIX):
                    temps.append(name)
    except OSError:
        return None
    if temps and not wanted.isdisjoint(temps):  # a data file is never its own temp file
        temps = [n for n in temps if n not in wanted]
    seen = listings.get()
    if seen is not None:
        seen[os.path.normpath(path)] = (temps, subdirs)
    return found


def _entry_kind(e: os.DirEntry[str]) -> int:
    if e.is_file(follow_symlinks=False):
        return _REGULAR
    return _DIRECTORY if e.is_dir(follow_symlinks=False) else _OTHER


def files_exist(root: Path, rels: Sequence[str], *, present: bool) -> list[Check]:
    """Existence of data files, nothing read: each must be a regular file (``present``) or be
    absent. Each directory is opened once from the root without following symlinks; one with
    many of the paths is listed once; a listing decides only the expected answer, anything else
    is looked at again with ``lstat``. A ``missing`` answer carries no expectation; the caller
    adds it."""
    prefix = f"{os.fspath(root)}/"
    out: list[Check | None] = [None] * len(rels)
    dirs, names = split_paths(rels)
    if may_escape(rels):  # only then, one by one
        for n, rel in enumerate(rels):
            if outside(rel):
                out[n] = OUTSIDE
                dirs[n] = None
    runs = directory_runs(dirs)
    try:
        with durable.opened_root(root) as root_fd:
            for directory, spans in runs.items():
                indexes = positions(spans)
                try:
                    dir_fd = nofollow.open_dir(root_fd, directory)
                except OSError as e:
                    unreachable = _unreachable(e, present)
                    for n in indexes:
                        out[n] = unreachable
                    continue
                try:
                    _exist_in(dir_fd, prefix + directory if directory else prefix, indexes, names, present, out)
                finally:
                    os.close(dir_fd)
    except OSError as e:  # the root itself could not be opened: nothing under it can be checked
        out = [c or Check(UNKNOWN, detail=reason_of(e)) for c in out]
    return out  # type: ignore[return-value]  # every slot was filled above


_RPARTITION = methodcaller("rpartition", "/")
_FIRST, _LAST = itemgetter(0), itemgetter(2)


def split_paths(rels: Sequence[str]) -> tuple[list[str | None], list[str]]:
    """Each data path's directory and name, per path in C, not a Python loop. A caller marks the
    paths it will not look at by setting their directory to None."""
    parts = list(map(_RPARTITION, rels))
    return list(map(_FIRST, parts)), list(map(_LAST, parts))


def directory_runs(dirs: Sequence[str | None]) -> dict[str, list[range]]:
    """Each directory's paths (by position; None: not looked at), as runs of consecutive ones: a
    check's come sorted, so mostly one run a directory (more where a subdirectory's paths sort
    between its own). Each directory is then opened once, however its paths are split."""
    runs: dict[str | None, list[range]] = {}
    end = 0
    for directory, run in groupby(dirs):
        start, end = end, end + len(list(run))
        runs.setdefault(directory, []).append(range(start, end))
    runs.pop(None, None)
    return runs  # type: ignore[return-value]  # None was taken out above


def positions(spans: list[range]) -> Sequence[int]:
    """The positions of a directory's runs (``directory_runs``), as one sequence."""
    return spans[0] if len(spans) == 1 else [n for span in spans for n in span]


def may_escape(rels: Sequence[str]) -> bool:
    """False when no path of ``rels`` can escape the root (``outside``), decided in C for all of
    them at once; True when one may, and each must then be looked at on its own."""
    joined = "\n".join(rels)
    return joined.startswith("/") or "\n/" in joined or "\x00" in joined or ".." in joined


def _exist_in(
    dir_fd: int, path: str, indexes: Sequence[int], names: list[str], present: bool, out: list[Check | None]
) -> None:
    """Answer for the paths at ``indexes`` (their names in ``names``), all in the open directory
    ``dir_fd``, into ``out``."""
    mine = names[indexes.start : indexes.stop] if isinstance(indexes, range) else [names[n] for n in indexes]
    listing = None
    wanted = set(mine)
    if len(mine) >= _LIST_AT:
        listing = list_data_dir(path, wanted, dir_fd)
    if listing is None:
        for n, name in zip(indexes, mine, strict=True):
            out[n] = _exists(dir_fd, name, present)
        return
    # The common answer for them all, decided in C: all there as regular files (or none there).
    if (len(listing) == len(wanted) and not any(listing.values())) if present else not listing:
        if isinstance(indexes, range):
            out[indexes.start : indexes.stop] = [SYNCED] * len(mine)
        else:
            for n in indexes:
                out[n] = SYNCED
        return
    get = listing.get
    for n, name in zip(indexes, mine, strict=True):
        kind = get(name)
        if (kind == _REGULAR) if present else (kind is None):
            out[n] = SYNCED
        else:
            out[n] = _exists(dir_fd, name, present)


def _unreachable(e: OSError, present: bool) -> Check:
    """The answer for every file of a directory that could not be opened."""
    if e.errno in ABSENT:
        return _MISSING if present else SYNCED
    if e.errno == errno.ELOOP:
        return Check(MODIFIED if present else UNEXPECTED, detail=through_link(e.filename))
    return Check(UNKNOWN, detail=reason_of(e))


def through_link(component: object) -> str:
    return f"goes through {component}, a symbolic link"


def _exists(dir_fd: int, name: str, present: bool) -> Check:
    try:
        st = lstat_data_file(name, dir_fd)
    except OSError as e:
        if e.errno in ABSENT:
            return _MISSING if present else SYNCED
        return Check(UNKNOWN, detail=reason_of(e))
    kind = kind_of(st.st_mode)
    if present:
        return SYNCED if kind is None else Check(MODIFIED, detail=kind)
    return Check(UNEXPECTED, actual=file_facts(st.st_size) if kind is None else None, detail=kind)


def file_paths(items: Sequence[tuple[str, str]]) -> list[str]:
    """The data paths of file jobs' ``(target, payload)`` pairs: from the ordering key
    (``file_key``) when there is one, else the payload's ``path`` (no need to validate the
    whole model for it)."""
    prefix = file_key("")
    cut = len(prefix)
    rels = [key[cut:] for key, _ in items if key.startswith(prefix)]
    if len(rels) == len(items) and "" not in rels:
        return rels  # every target a file's key (the common case): one slice each
    out = []
    for key, payload in items:
        # ``Target.parse`` for the one kind a file job has, without building a Target per path
        # (``benchmarks/reconcile.py`` times the existence check this feeds).
        if key.startswith(prefix) and len(key) > cut:
            out.append(key[cut:])
        else:  # a target of another kind: the path is the payload's
            out.append(orjson.loads(payload)["path"])
    return out


def kind_of(mode: int) -> str | None:
    """None for a regular file, else what the entry is instead."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    return "is not a regular file"


def reason_of(e: OSError) -> str:
    return e.strerror or type(e).__name__
