"""The one way a handler changes a data file, and the one mapping from its errors to outcomes.

``write_locked`` and ``delete_locked`` take the path's lock, open its directory from the root
without following symlinks, remove temp files an interrupted earlier attempt left, confirm the
job's lease and act durably; ``file_error`` turns a file system error met on the way into the
job's outcome (failed at once, retried, or waiting for space).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ...errors import PermanentError, RetryableError, StorageFull
from . import durable, locks
from .durable import DataFile, Known, NotRegularFile

if TYPE_CHECKING:
    from ..context import JobContext
    from .dirsync import DirSyncs


def write_locked(ctx: JobContext, rel: str, data: bytes, *, overwrite: bool = True) -> bool:
    """Make the data file ``rel`` (canonical, from ``checked_path``) hold exactly ``data``, the one
    way a handler writes: under the path's lock, through a directory opened from the root without
    following symlinks, after removing temp files an interrupted earlier attempt left, and only
    while this worker still holds the job (``ctx.confirm_lease()``). False when the file already
    held ``data`` (a re-run after the write landed but the completion did not commit; the file is
    fsynced again first). PermanentError when a different file is there and not ``overwrite``,
    or when what is there is not a regular file; any file system error goes through
    ``file_error``."""
    return write_known(ctx, rel, data, overwrite=overwrite)[0]


def write_known(ctx: JobContext, rel: str, data: bytes, *, overwrite: bool = True) -> tuple[bool, Known]:
    """``write_locked``, with the moment and stat of the file holding ``data``, taken under the
    path's lock (what its fingerprint records)."""
    syncs = ctx.dir_syncs
    with _locked(ctx, rel, create=True) as f:
        st = f.regular()
        if st is not None:
            if st.st_size == len(data) and (held := f.holds(data, sync_dir=syncs is None)) is not None:
                _owe_dir_sync(syncs, f, ctx)
                return False, held
            if not overwrite:
                raise PermanentError(f"{rel} exists with different content and overwrite is false")
        ctx.confirm_lease()  # a worker that lost this job's lock must not write late
        known = f.write(data, sync_dir=syncs is None)
        _owe_dir_sync(syncs, f, ctx)
        return True, known


def _owe_dir_sync(syncs: DirSyncs | None, f: DataFile, ctx: JobContext) -> None:
    """Under a worker, the directory's fsync is shared with the other jobs of the group commit
    that records this one, and happens before it (``dirsync`` says why that is safe)."""
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
def _locked(ctx: JobContext, rel: str, *, create: bool, doing: str = "") -> Iterator[DataFile]:
    try:
        # One descriptor of the root for the lock file and the data file's directory.
        with (
            durable.opened_root(ctx.root) as root_fd,
            locks.path_lock(ctx.root, rel, root_fd=root_fd),
            durable.data_file(ctx.root, rel, create=create, root_fd=root_fd) as f,
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
    cause = e.strerror if isinstance(e, NotRegularFile) else _PERMANENT.get(e.errno or 0)
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
