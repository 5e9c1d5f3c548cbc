"""Directory fsyncs shared by the jobs of one group commit.

A file job's effect is durable once its file is fsynced and its directory entry is: the file
right after it is written, the directory after the rename (or unlink). The directory's fsync need
not follow each rename at once; it must come before the commit that records the job completed,
since a completed job promises its effect survives a crash. The worker gives every job of a
claimed batch one ``DirSyncs``; a handler writing through ``effects.write_locked`` leaves the
directory to it; before each group commit the worker calls ``flush``, which fsyncs each directory
touched since the last one once, however many of the commit's jobs renamed into it. A job whose
directory could not be fsynced is not recorded completed (``flush`` names it; the worker retries
it). So a commit never records a job whose entry is not durable, and N jobs over D directories
cost D directory fsyncs a commit instead of N.

Each directory is held by a duplicate of the descriptor its job renamed through (the one opened
from the root without following symlinks), so the directory fsynced is the one written into,
whatever was renamed or swapped for a symlink since; two descriptors of one directory are told
apart from two directories by (device, inode).
"""

from __future__ import annotations

import os
import threading

from . import durable


class DirSyncs:
    """The directories whose entries the jobs of one batch changed and have not fsynced yet."""

    __slots__ = ("_closed", "_dirs", "_lock")

    def __init__(self) -> None:
        # (st_dev, st_ino) -> (a descriptor of the directory, {job id: data path})
        self._dirs: dict[tuple[int, int], tuple[int, dict[str, str]]] = {}
        self._lock = threading.Lock()  # a handler with a timeout runs in a thread of its own
        self._closed = False

    def add(self, dir_fd: int, job_id: str, rel: str) -> None:
        """Owe an fsync of the open directory ``dir_fd`` before ``job_id`` (which changed the
        entry ``rel`` in it) is recorded. After ``close`` (a handler that outlived its batch)
        the directory is fsynced now."""
        st = os.fstat(dir_fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            if not self._closed:
                held = self._dirs.get(key)
                if held is None:
                    self._dirs[key] = (os.dup(dir_fd), {job_id: rel})
                else:
                    held[1][job_id] = rel
                return
        durable.fsync_fd(dir_fd)

    def flush(self) -> dict[str, tuple[str, OSError]]:
        """fsync every directory owed, once each; returns the jobs whose directory failed, each
        with its data path and the error (they must not be recorded completed)."""
        with self._lock:
            owed, self._dirs = self._dirs, {}
        failed: dict[str, tuple[str, OSError]] = {}
        for fd, jobs in owed.values():
            try:
                durable.fsync_fd(fd)
            except OSError as e:
                failed.update((job_id, (rel, e)) for job_id, rel in jobs.items())
            finally:
                os.close(fd)
        return failed

    def close(self) -> dict[str, tuple[str, OSError]]:
        """``flush``, and from now on ``add`` fsyncs at once."""
        with self._lock:
            self._closed = True
        return self.flush()
