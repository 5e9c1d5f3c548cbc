"""Waking idle workers when another process commits to a SQLite ledger.

SQLite has no LISTEN/NOTIFY, but every commit writes the ``-wal`` file. On Linux the watcher
asks the kernel (inotify) to report writes to it: an idle worker wakes within a millisecond of
another process's commit and costs no CPU while nothing happens. Elsewhere it falls back to a
``stat`` of the WAL file every few milliseconds. A change either way misses only delays the job
to the next poll.

The watcher looks only while one of its process's threads waits for work. Every commit writes
the WAL many times, and a watcher reading each write while the workers drain competes with them
for the GIL and the cores; with several worker processes each watcher woke for every other
process's commit too (benchmarks/README.md, ``procs.py``). Writes made meanwhile stay queued in
the kernel (or show as a changed ``stat``), so the first wait after them is woken at once: never
a write missed, at most one claim that finds nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading

from .wakeup import Wakeup

_IN_MODIFY, _IN_CREATE, _IN_MOVED_TO, _IN_Q_OVERFLOW = 0x2, 0x100, 0x80, 0x4000
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")


class WalWatcher:
    """A daemon thread that bumps ``wakeup`` whenever the ledger's WAL file is written."""

    def __init__(self, database: str, wakeup: Wakeup, *, interval: float = 0.005) -> None:
        self._wal = f"{database}-wal"
        self._wakeup = wakeup
        self._interval = interval
        self._stop = threading.Event()
        self._inotify = _inotify_fd(os.path.dirname(self._wal) or ".")
        target = self._run_inotify if self._inotify is not None else self._run_stat
        self._thread = threading.Thread(target=target, name="tether-walwatch", daemon=True)

    def start(self) -> WalWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
        if self._inotify is not None:
            os.close(self._inotify)
            self._inotify = None

    def _run_inotify(self) -> None:
        while not self._stop.is_set():
            self.watch_once(0.25)  # the timeout only checks for stop

    def watch_once(self, timeout: float) -> bool:
        """One turn of the inotify loop: if a thread waits for work, read what the WAL had
        written since the last turn (waiting up to ``timeout`` s for it) and wake the waiters;
        otherwise rest up to ``timeout`` s, leaving the writes queued. Whether it woke them."""
        fd = self._inotify
        if fd is None or not self._wakeup.waited_on(timeout):
            return False
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if not _names_file(data, os.path.basename(self._wal)):
            return False
        self._wakeup.wake_local()
        return True

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._wal)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _run_stat(self) -> None:
        last = self._signature()
        while not self._stop.wait(self._interval):
            if not self._wakeup.waited_on(0.25):
                continue
            current = self._signature()
            if current != last:
                last = current
                self._wakeup.wake_local()


def _names_file(data: bytes, name: str) -> bool:
    """Whether a buffer of inotify events mentions the file ``name`` (or the kernel's queue
    overflowed, dropping events that may have)."""
    encoded = os.fsencode(name)
    offset = 0
    while offset + _EVENT.size <= len(data):
        _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        start = offset + _EVENT.size
        if mask & _IN_Q_OVERFLOW or data[start : start + length].rstrip(b"\0") == encoded:
            return True
        offset = start + length
    return False


def _inotify_fd(directory: str) -> int | None:
    """An inotify descriptor watching writes in ``directory``, or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd: int = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO) < 0:
        os.close(fd)
        return None
    return fd
