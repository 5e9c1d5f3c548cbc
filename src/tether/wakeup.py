"""Waking idle workers the moment a job is enqueued, instead of at the next poll."""

from __future__ import annotations

import threading


class Wakeup:
    """A counter idle workers wait on; ``notify`` after an enqueue commits bumps it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    def notify(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a notify after generation ``seen``; True if one came."""
        with self._cond:
            return self._cond.wait_for(lambda: self._generation != seen, timeout)
