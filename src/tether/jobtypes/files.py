"""Data files: path checks at enqueue, the one locked write, file errors, and the file probes.

Everything a job type that acts on files under the data root shares: ``checked_path`` and
``file_target`` for ``prepare``/``ordering_key``; ``write_locked``/``delete_locked`` for handlers
(lock, open without following symlinks, clean up, confirm the lease, act durably); ``file_error``,
the one mapping from a file system error to a job's outcome; ``check_file``/``files_exist`` for
probes.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from itertools import groupby
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from .. import beneath, fs
from ..errors import InvalidPayload, PermanentError, RetryableError, StorageFull, UnsafePath
from .base import IN_SYNC, MISSING, MODIFIED, SYNCED, UNEXPECTED, UNKNOWN, Check, differences_of, file_facts
from .target import FILE, Target, file_key

if TYPE_CHECKING:
    from .context import JobContext
    from .dirsync import DirSyncs

__all__ = [
    "IN_SYNC",
    "check_file",
    "check_files",
    "checked_path",
    "delete_locked",
    "file_error",
    "file_paths",
    "file_target",
    "files_exist",
    "with_expected",
    "write_locked",
]


def checked_path(job_type: str, field: str, root: Path, rel: str) -> str:
    """``rel`` in canonical form if it is safe under ``root``, else UnsafePath naming the field."""
    try:
        return fs.canonical(root, rel)
    except fs.PathRejected as e:
        raise UnsafePath(job_type, field, rel, str(e)) from e


def file_target(rel: str) -> str:
    """The ordering key of a data file: every job touching one path shares it."""
    return file_key(rel)


def enqueue_collision(job_type: str, field: str, root: Path, rel: str) -> None:
    """Refuse ``rel`` at enqueue when a directory on its way is a regular file now (``a.json`` for
    ``a.json/b.json``): the job could never succeed. Only a hint: the handler's own open is the
    authority, so a file made or removed after this check is still found at run time."""
    parts = rel.split("/")[:-1]
    if not parts:
        return
    real = f"{os.fspath(root)}/"
    for n in range(1, len(parts) + 1):
        try:
            mode = os.lstat(real + "/".join(parts[:n])).st_mode
        except OSError:
            return  # missing (made at run time) or unreadable: the run decides
        if stat.S_ISREG(mode):
            comp = "/".join(parts[:n])
            raise InvalidPayload(job_type, [f"{field}: {rel!r} cannot be made: {comp} is a file, not a directory"])
        if not stat.S_ISDIR(mode):
            return  # a symlink (canonical resolved it) or something odd: the run decides


# -- the locked write ---------------------------------------------------------------------------


def write_locked(ctx: JobContext, rel: str, data: bytes, *, overwrite: bool = True) -> bool:
    """Make the data file ``rel`` (canonical, from ``checked_path``) hold exactly ``data``, the one
    way a handler writes: under the path's lock, through a directory opened from the root without
    following symlinks, after removing temp files an interrupted earlier attempt left, and only
    while this worker still holds the job (``ctx.confirm_lease()``). False when the file already
    held ``data`` (a re-run after the write landed but the completion did not commit; the file is
    fsynced again first). PermanentError when a different file is there and not ``overwrite``,
    or when what is there is not a regular file; any file system error goes through
    ``file_error``."""
    syncs = ctx.dir_syncs
    with _locked(ctx, rel, create=True) as f:
        st = f.regular()
        if st is not None:
            if st.st_size == len(data) and f.holds(data, sync_dir=syncs is None):
                _owe_dir_sync(syncs, f, ctx)
                return False
            if not overwrite:
                raise PermanentError(f"{rel} exists with different content and overwrite is false")
        ctx.confirm_lease()  # a worker that lost this job's lock must not write late
        f.write(data, sync_dir=syncs is None)
        _owe_dir_sync(syncs, f, ctx)
        return True


def _owe_dir_sync(syncs: DirSyncs | None, f: fs.DataFile, ctx: JobContext) -> None:
    """Under a worker, the directory's fsync is shared with the other jobs of the group commit
    that records this one, and happens before it (``jobtypes.dirsync`` says why that is safe)."""
    if syncs is not None:
        syncs.add(f.dir_fd, ctx.job.id, f.rel)


def delete_locked(ctx: JobContext, rel: str) -> bool:
    """Remove the data file ``rel`` durably, as ``write_locked`` writes; False if it was not there
    (a directory on the way missing or a regular file included). A directory there is a
    PermanentError (delete_file removes files); a FIFO or socket is removed like a file (unlinking
    one neither reads nor blocks)."""
    syncs = ctx.dir_syncs
    try:
        with _locked(ctx, rel, create=False, doing="delete_file removes files") as f:
            ctx.confirm_lease()
            deleted = f.delete(sync_dir=syncs is None)
            _owe_dir_sync(syncs, f, ctx)
            return deleted
    except (FileNotFoundError, NotADirectoryError):
        return False  # a directory on the way is missing, or is a file: the file is not there


@contextmanager
def _locked(ctx: JobContext, rel: str, *, create: bool, doing: str = "") -> Iterator[fs.DataFile]:
    try:
        # One descriptor of the root for the lock file and the data file's directory.
        with (
            fs.opened_root(ctx.root) as root_fd,
            fs.path_lock(ctx.root, rel, root_fd=root_fd),
            fs.data_file(ctx.root, rel, create=create, root_fd=root_fd) as f,
        ):
            if not ctx.job.first_run:
                # An earlier attempt may have died mid-write; only a re-run can have left a
                # temp file for this path, so first runs skip the directory scan.
                f.remove_stale_temps()
            yield f
    except OSError as e:
        if not create and e.errno == errno.ENOTDIR:
            raise  # a delete: a file on the way means the path cannot exist (delete_locked)
        outcome = file_error(e, rel, doing)
        if outcome is e:
            raise
        raise outcome from e


# -- file system errors -> outcomes -------------------------------------------------------------

# Can never succeed as given: fail at once.
_PERMANENT = {
    errno.ENOTDIR: "is a file, not a directory",
    errno.EISDIR: "is a directory",
    errno.ENAMETOOLONG: "has a name too long for the file system",
    errno.ELOOP: "is a symbolic link, which tether does not follow inside the data root",
}
# May succeed once an operator fixes permissions or a mount: retried, the cause in the message.
_OPERATOR = frozenset((errno.EACCES, errno.EPERM, errno.EROFS))
# The storage is full: the job waits without spending an attempt (StorageFull).
_FULL = frozenset((errno.ENOSPC, errno.EDQUOT))
# Transient (an I/O error, a busy file): retried with backoff.
_TRANSIENT = frozenset((errno.EIO, errno.EAGAIN, errno.EBUSY))


def file_error(e: OSError, rel: str, doing: str = "") -> Exception:
    """The one mapping from a file system error met on the data path ``rel`` to a job's outcome:

    - ENOTDIR, EISDIR, ENAMETOOLONG, ELOOP (a symlink where none may be), and an existing
      file that is not a regular file: PermanentError naming the path and the cause;
    - ENOSPC, EDQUOT: StorageFull (the job waits for space without spending an attempt);
    - EIO, EAGAIN, EBUSY: RetryableError (retried with backoff);
    - EACCES, EPERM, EROFS: RetryableError whose message says an operator can fix it;
    - anything else: ``e`` itself (retried).

    The RetryableErrors name the error by its text and its symbol: ``No space left on device (ENOSPC)``.
    """
    where = e.filename if isinstance(e.filename, str) and e.filename else rel
    on_the_way = f" (on the way to {rel})" if where != rel else ""
    cause = e.strerror if isinstance(e, fs.NotRegularFile) else _PERMANENT.get(e.errno or 0)
    if cause is not None:
        tail = f"; {doing}" if doing and where == rel and e.errno != errno.ELOOP else ""
        return PermanentError(f"{where} {cause}{on_the_way}{tail}")
    reason = e.strerror or type(e).__name__
    if (symbol := errno.errorcode.get(e.errno or 0)) is not None:  # ENOSPC: what an operator greps logs for
        reason = f"{reason} ({symbol})"
    if e.errno in _OPERATOR:
        return RetryableError(f"{where}: {reason}{on_the_way}; retried: fix the permissions or mount of the data root")
    if e.errno in _FULL:
        return StorageFull(f"{where}: {reason}{on_the_way}; waiting for space on the data root")
    if e.errno in _TRANSIENT:
        return RetryableError(f"{where}: {reason}{on_the_way}")
    return e


# -- reconcile probes of data files ------------------------------------------------------------

# Absent: no such entry, or a parent is not a directory (so the file cannot exist).
_ABSENT = (errno.ENOENT, errno.ENOTDIR)
_CHUNK = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_noatime = getattr(os, "O_NOATIME", 0)


def open_data_file(dir_fd: int, name: str) -> int:
    """Open a data file to check it: in its directory (opened from the root without following
    symlinks), read-only, not through a symlink (ELOOP), never blocking on a FIFO, and without
    touching its access time where the OS allows (O_NOATIME needs ownership)."""
    global _noatime
    if _noatime:
        try:
            return os.open(name, _OPEN_FLAGS | _noatime, dir_fd=dir_fd)
        except PermissionError as e:
            if e.errno != errno.EPERM:
                raise
            _noatime = 0
    return os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)


def lstat_data_file(name: str, dir_fd: int) -> os.stat_result:
    """What is at ``name`` in the open directory ``dir_fd``, not followed if a symlink."""
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


# Module attributes (open_data_file, lstat_data_file, list_data_dir), so a test can swap in a
# fake that fails (tests run as root, where a chmod 000 file is still readable).


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
        temps = [n for n in regular if n.endswith(fs.TEMP_SUFFIX)] if fs.TEMP_SUFFIX in "/".join(regular) else []
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
                elif name.endswith(fs.TEMP_SUFFIX):
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
    # Per path in C, not a Python loop: its directory and name, and (rarely) whether it escapes.
    parts = list(map(_RPARTITION, rels))
    dirs: list[str | None] = list(map(_FIRST, parts))
    names: list[str] = list(map(_LAST, parts))
    if _may_escape(rels):  # only then, one by one
        for n, rel in enumerate(rels):
            if _outside(rel):
                out[n] = _OUTSIDE
                dirs[n] = None
    # Each directory's paths, as runs of consecutive ones: a check's come sorted, so mostly one
    # run a directory (more where a subdirectory's paths sort between its own).
    runs: dict[str | None, list[range]] = {}
    end = 0
    for directory, run in groupby(dirs):
        start, end = end, end + len(list(run))
        runs.setdefault(directory, []).append(range(start, end))
    runs.pop(None, None)
    try:
        with fs.opened_root(root) as root_fd:
            for directory, spans in runs.items():
                assert directory is not None  # the escaping paths' None was taken out above
                indexes: Sequence[int] = spans[0] if len(spans) == 1 else [n for span in spans for n in span]
                try:
                    dir_fd = beneath.open_dir(root_fd, directory)
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
        out = [c or Check(UNKNOWN, detail=_reason(e)) for c in out]
    return out  # type: ignore[return-value]  # every slot was filled above


_RPARTITION = methodcaller("rpartition", "/")
_FIRST, _LAST = itemgetter(0), itemgetter(2)


def _may_escape(rels: Sequence[str]) -> bool:
    """False when no path of ``rels`` can escape the root (``_outside``), decided in C for all of
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
    if e.errno in _ABSENT:
        return _MISSING if present else SYNCED
    if e.errno == errno.ELOOP:
        return Check(MODIFIED if present else UNEXPECTED, detail=_through_link(e.filename))
    return Check(UNKNOWN, detail=_reason(e))


def _through_link(component: object) -> str:
    return f"goes through {component}, a symbolic link"


def _exists(dir_fd: int, name: str, present: bool) -> Check:
    try:
        st = lstat_data_file(name, dir_fd)
    except OSError as e:
        if e.errno in _ABSENT:
            return _MISSING if present else SYNCED
        return Check(UNKNOWN, detail=_reason(e))
    kind = _kind(st.st_mode)
    if present:
        return SYNCED if kind is None else Check(MODIFIED, detail=kind)
    return Check(UNEXPECTED, actual=file_facts(st.st_size) if kind is None else None, detail=kind)


def check_file(root: Path, rel: str, expected: bytes) -> Check:
    """Check that one data file holds exactly ``expected``: size first, bytes only when the sizes
    agree, a hash only when the bytes differ. Only a regular file is read (found by fstat of a
    non-blocking open, before any read)."""
    return check_files(root, [(rel, expected)])[0]


def check_files(root: Path, items: Iterable[tuple[str, bytes]]) -> list[Check]:
    """``check_file`` for several ``(path, expected bytes)``: the root is opened once, and each
    directory once for the paths in it (up to ``_DIRS_OPEN`` directories held at a time). The
    items are taken one at a time: a generator that renders each expectation as it is asked
    keeps a file's bytes and its expectation in the CPU's caches together (measured: a content
    check ran a fifth faster so than with a page's expectations rendered first)."""
    out: list[Check] = []
    opened: dict[str, int | OSError] = {}
    try:
        root_fd = fs.open_root(root)
    except OSError as e:  # the root itself could not be opened: nothing under it can be checked
        return [_OUTSIDE if _outside(rel) else Check(UNKNOWN, detail=_reason(e)) for rel, _ in items]
    last_directory: str | None = None
    dir_fd: int | OSError = 0
    try:
        for rel, expected in items:
            if _outside(rel):
                out.append(_OUTSIDE)
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
                out.append(_unopened(dir_fd, expected, _through_link(dir_fd.filename)))
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
                if st.st_size == size < _CHUNK and stat.S_ISREG(st.st_mode) and os.read(fd, size + 1) == expected:
                    out.append(SYNCED)
                else:
                    out.append(_compared(fd, st, expected))
            except OSError as e:
                out.append(Check(UNKNOWN, detail=_reason(e)))
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
        return beneath.open_dir(root_fd, directory)
    except OSError as e:
        return e


def _unopened(e: OSError, expected: bytes, link: str) -> Check:
    """The answer for a data file that could not be opened, or whose directory could not be:
    ``link`` says what a symlink met on the way (ELOOP) was."""
    if e.errno in _ABSENT:
        return with_expected(Check(MISSING), expected)
    if e.errno == errno.ELOOP:
        return with_expected(Check(MODIFIED, detail=link), expected)
    return Check(UNKNOWN, detail=_reason(e))


def _compared(fd: int, st: os.stat_result, expected: bytes) -> Check:
    """The answer for an open data file that is not the common one (``check_files``): not a
    regular file, another size, or bytes that differ."""
    if not stat.S_ISREG(st.st_mode):
        return with_expected(Check(MODIFIED, detail=_kind(st.st_mode)), expected)
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
    size = len(expected)
    first = os.read(fd, size + 1 if size < _CHUNK else _CHUNK)
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
    prefix = file_key("")
    cut = len(prefix)
    rels = [key[cut:] for key, _ in items if key.startswith(prefix)]
    if len(rels) == len(items) and "" not in rels:
        return rels  # every target a file's key (the common case): one slice each
    out = []
    for key, payload in items:
        # ``Target.parse`` for the one kind a file job has, without building a Target per path
        # (a tenth of an existence check's time).
        if key.startswith(prefix) and len(key) > cut:
            out.append(key[cut:])
        else:
            target = Target.parse(key)
            out.append(target.identity if target.kind == FILE else orjson.loads(payload)["path"])
    return out


def with_expected(check: Check, expected: bytes | None) -> Check:
    if expected is None:
        return check
    facts = file_facts(len(expected), fs.sha256(expected))
    return replace(check, expected=facts, differences=differences_of(facts, check.actual))


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
