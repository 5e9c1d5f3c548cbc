"""Waking idle workers the moment a job is enqueued, instead of at the next poll.

In one process a condition variable is enough (``Wakeup``). On PostgreSQL, workers on other
machines are woken with ``LISTEN/NOTIFY`` (``PgWakeup``). Either way a wake-up is only a hint:
the worker's poll interval stays the fallback, so a lost notification delays a job by at most
one poll and never loses it.
"""

from __future__ import annotations

import secrets
import threading
import weakref
from typing import Any

import sqlalchemy as sa

from .. import events

DEFAULT_CHANNEL = "tether_jobs"


class Wakeup:
    """A counter idle workers wait on; ``wake_local`` after an enqueue commits bumps it."""

    sends = False
    """Whether a commit also wakes other processes (``notify_in``, ``notify_after_commit``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._generation = 0
        self._waiting = 0  # threads in wait(): with none, a bump is a counter, not Condition.notify_all
        self._waited_on = threading.Event()  # set while a thread is in wait()

    def wake_local(self) -> None:
        """Wake this process's waiters only (shutdown, a file watcher): no message is sent."""
        # acquire and release rather than ``with``: half the cost, on every enqueue.
        self._lock.acquire()
        try:
            self._generation += 1
            if self._waiting:
                self._cond.notify_all()
        finally:
            self._lock.release()

    def notify_in(self, cur: Any) -> None:
        """Queue the cross-process wake-up inside the caller's write transaction (``cur`` is the
        cursor of ``Backend.write()``); it is delivered when, and only if, that transaction
        commits. Nothing to do in-process: call ``wake_local`` after the commit."""

    def notify_after_commit(self, cur: Any) -> None:
        """Queue the cross-process wake-up to be sent once the transaction of ``cur``, one of
        tether's own (``Backend.transact``), has committed; never sent if it does not."""

    def generation(self) -> int:
        with self._lock:
            return self._generation

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a notify after generation ``seen``; True if one came."""
        with self._lock:
            self._waiting += 1
            self._waited_on.set()
            try:
                return self._cond.wait_for(lambda: self._generation != seen, timeout)
            finally:
                self._waiting -= 1
                if not self._waiting:
                    self._waited_on.clear()

    def waited_on(self, timeout: float) -> bool:
        """Block until a thread is in ``wait()`` (at most ``timeout`` s); whether one is. A
        watcher that wakes waiters rests meanwhile: with every thread busy there is nobody to wake."""
        return self._waited_on.wait(timeout)

    def close(self) -> None:
        """Release what the wake-up holds (nothing for the in-process one)."""


class PgWakeup(Wakeup):
    """``Wakeup`` across processes and machines through PostgreSQL ``LISTEN/NOTIFY``.

    ``notify_in(cur)`` sends ``NOTIFY channel`` inside an application's transaction, so listeners
    hear it at the commit and never before the job is visible; ``notify_after_commit(cur)`` sends
    it just after the commit of one of tether's own, in the same round trip. The first ``wait()`` starts a
    daemon thread that holds its own connection, ``LISTEN``s, and bumps the generation on every
    notification from another ``PgWakeup``; it reconnects with backoff when the connection drops,
    and wakes waiters after each reconnect because notifications sent meanwhile are gone.
    Processes that only enqueue never listen.
    """

    sends = True

    def __init__(
        self,
        engine: sa.Engine,
        channel: str = DEFAULT_CHANNEL,
        *,
        listen: bool = True,
        max_backoff: float = 30.0,
    ) -> None:
        super().__init__()
        if not channel.replace("_", "").isalnum():
            raise ValueError(f"channel must be letters, digits and underscores, got {channel!r}")
        self.engine = engine
        self.channel = channel
        self.max_backoff = max_backoff
        # Our own NOTIFYs come back to our listener; the token lets it skip them (the local
        # waiters were already woken by wake_local() after the commit).
        self.token = secrets.token_hex(8)
        self._listen = listen
        self._started = False
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self.listening = threading.Event()
        """Set while the listener holds a connection with ``LISTEN`` active (tests wait on it)."""
        self._thread: threading.Thread | None = None

    def notify_in(self, cur: Any) -> None:
        # NOTIFY is transactional: listeners hear it at the commit, with no extra connection,
        # round trip or commit (a NOTIFY after the commit would cost one of each).
        cur.send(NOTIFY_SQL, {"channel": self.channel, "token": self.token})

    def notify_after_commit(self, cur: Any) -> None:
        # A NOTIFY holds one lock of the whole server from just before its transaction's commit
        # record until that is flushed, so notifying commits cannot share a flush. After the
        # commit, in a transaction of its own that does not wait for its flush, it holds that
        # lock for microseconds, and listeners still hear it only once the jobs are visible.
        cur.after_commit(NOTIFY_AFTER_COMMIT_SQL, {"channel": self.channel, "token": self.token})

    def wait(self, seen: int, timeout: float) -> bool:
        self.start()
        return super().wait(seen, timeout)

    def start(self) -> None:
        """Start the listener thread (idempotent; a no-op with ``listen=False``)."""
        if not self._listen or self._started:
            return
        with self._start_lock:
            if self._started:
                return
            self._started = True
            conninfo = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            # The thread holds only a weak reference, so a wake-up nobody closed still ends
            # once it is garbage.
            self._thread = threading.Thread(
                target=_listen_loop,
                args=(
                    weakref.ref(self),
                    conninfo,
                    self.channel,
                    self.token,
                    self._stop,
                    self.listening,
                    self.max_backoff,
                ),
                name=f"tether-listen-{self.channel}",
                daemon=True,
            )
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the listener and close its connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


NOTIFY_SQL = "SELECT pg_notify(%(channel)s, %(token)s)"  # run on the driver cursor: psycopg's placeholders
# set_config(..., true) sets its own transaction only: the commit of the jobs before it is durable.
NOTIFY_AFTER_COMMIT_SQL = "SELECT set_config('synchronous_commit', 'off', true), pg_notify(%(channel)s, %(token)s)"

# How long one wait for notifications lasts before the listener checks whether to stop.
_TICK = 0.5


def _listen_loop(
    ref: weakref.ref[PgWakeup],
    conninfo: str,
    channel: str,
    token: str,
    stop: threading.Event,
    listening: threading.Event,
    max_backoff: float,
) -> None:
    import psycopg

    backoff = 0.0
    while not stop.is_set() and ref() is not None:
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
                conn.execute(f"LISTEN {channel}")
                listening.set()
                backoff = 0.0
                _bump(ref)  # anything sent while we were not listening is lost: poll now
                while not stop.is_set():
                    for note in conn.notifies(timeout=_TICK):
                        if note.payload != token and not _bump(ref):
                            return
                    if ref() is None:
                        return
        except psycopg.Error as e:
            listening.clear()
            backoff = min(max_backoff, max(0.1, backoff * 2))
            events.emit("listen_error", channel=channel, error=type(e).__name__, retry_in=backoff)
            stop.wait(backoff)
        finally:
            listening.clear()


def _bump(ref: weakref.ref[PgWakeup]) -> bool:
    wakeup = ref()
    if wakeup is None:
        return False
    wakeup.wake_local()
    return True


def wakeup_for(engine: sa.Engine, channel: str = DEFAULT_CHANNEL) -> Wakeup:
    """The wake-up that fits the database: LISTEN/NOTIFY on PostgreSQL, in-process otherwise."""
    if engine.dialect.name == "postgresql":
        return PgWakeup(engine, channel)
    return Wakeup()
