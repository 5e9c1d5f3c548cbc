"""The WAL watcher (ledger/walwatch.py): it reads the WAL's writes only while a thread waits for
work, and a write made while none waited still wakes the first wait after it."""

from __future__ import annotations

import os
import select
import struct
import threading
import time

import pytest

from tether.ledger import walwatch
from tether.ledger.wakeup import Wakeup


@pytest.fixture
def watcher(tmp_path):
    w = walwatch.WalWatcher(str(tmp_path / "l.db"), Wakeup())  # not started: the test turns it
    if w._inotify is None:
        pytest.skip("no inotify on this kernel (the stat fallback is covered in test_worker.py)")
    yield w
    os.close(w._inotify)


def _commit(watcher: walwatch.WalWatcher) -> None:
    """What another process's commit does to the WAL, as the kernel reports it: a write."""
    with open(watcher._wal, "ab") as f:
        f.write(b"frame")


def _queued(watcher: walwatch.WalWatcher) -> bool:
    assert watcher._inotify is not None
    return bool(select.select([watcher._inotify], [], [], 0)[0])


def test_the_watcher_rests_while_no_thread_waits_and_leaves_the_writes_queued(watcher):
    wakeup = watcher._wakeup
    before = wakeup.generation()
    _commit(watcher)
    assert watcher.watch_once(0) is False  # every thread busy: nothing read, nobody woken
    assert wakeup.generation() == before
    assert _queued(watcher)  # the write waits in the kernel for the next idle thread


def test_a_write_made_while_the_worker_was_busy_wakes_its_next_wait(watcher):
    wakeup = watcher._wakeup
    seen = wakeup.generation()  # the worker reads the generation, then claims (finding nothing) ...
    _commit(watcher)  # ... while another process commits a job
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(wakeup.wait(seen, 30)))
    waiter.start()  # ... and only then waits
    deadline = time.monotonic() + 10
    while not wakeup.waited_on(0.01):
        assert time.monotonic() < deadline
    assert watcher.watch_once(5) is True
    waiter.join(10)
    assert woken == [True]
    assert not _queued(watcher)


def test_an_overflowed_inotify_queue_counts_as_a_write():
    overflow = struct.pack("iIII", -1, 0x4000, 0, 0)  # IN_Q_OVERFLOW: events were dropped
    assert walwatch._names_file(overflow, "l.db-wal")
    other = struct.pack("iIII", 1, 0x2, 0, 16) + os.fsencode("l.db").ljust(16, b"\0")
    assert not walwatch._names_file(other, "l.db-wal")
    assert walwatch._names_file(other + struct.pack("iIII", 1, 0x2, 0, 16) + b"l.db-wal".ljust(16, b"\0"), "l.db-wal")
