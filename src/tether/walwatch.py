"""Waking idle workers when another process commits to a SQLite ledger.

SQLite has no LISTEN/NOTIFY. Every commit appends to the ``-wal`` file, so a cheap ``stat`` of
it every few milliseconds tells an idle worker that something changed, without a query and
without the enqueuing process knowing who is listening. A change the stat misses (two commits
in one timestamp tick at the same size) only delays the job to the next poll.
"""

from __future__ import annotations

import os
import threading

from .wakeup import Wakeup


class WalWatcher:
    """A daemon thread that bumps ``wakeup`` whenever the WAL file changes."""

    def __init__(self, database: str, wakeup: Wakeup, *, interval: float = 0.005) -> None:
        self._wal = f"{database}-wal"
        self._wakeup = wakeup
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tether-walwatch", daemon=True)

    def start(self) -> WalWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._wal)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _run(self) -> None:
        last = self._signature()
        while not self._stop.wait(self._interval):
            current = self._signature()
            if current != last:
                last = current
                self._wakeup.wake_local()
