"""Group commit: enqueues that arrive from several threads of one process while a commit is under
way are written together by the next transaction, so that many callers share one durable commit
(one fsync on SQLite) instead of queueing for one each.

Every enqueue of tether's own transaction goes this way, a lone one too: a caller files its
request, and if fewer than ``at_once`` commits are in flight it leads at once, committing every
request waiting by then (its own, and any that came with it) in one transaction. Otherwise it
waits: when a commit ends, its leader hands the lead, with every request waiting by then, to the
oldest of them. So a lone caller commits at once and never waits for company, and a caller that
arrives during a commit waits for at most that commit and its own. Each caller returns once the
transaction holding its request has ended, with its own outcome (``Request.results`` or
``Request.error``), which the commit function sets for each request of the batch.

Only callers that would have committed alone anyway are grouped: a transaction an application
holds (``session=``) or gathers (``Coordinator.transaction()``) keeps its own.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import CommitUnknown
from .notes import Note
from .record import InsertResult, JobRecord


class Request:
    """One caller's jobs (with the notes of some, by id) and, once its transaction has ended, its
    outcome: ``results`` or ``error``."""

    __slots__ = ("jobs", "notes", "results", "error", "batch", "done", "_ready")

    def __init__(self, jobs: Sequence[JobRecord], notes: Mapping[str, Note] | None) -> None:
        self.jobs = jobs
        self.notes = notes
        self.results: list[InsertResult] | None = None
        self.error: BaseException | None = None
        self.batch: list[Request] | None = None  # set when the lead is handed to this request
        self.done: list[Request] = []  # handed with the lead: the callers of the commit before, to wake
        self._ready: Any = None  # a caller that waits: a lock held until a leader wakes it


class GroupCommit:
    """Commits the requests of one process's callers in shared transactions: ``commit(batch)``
    runs one transaction for ``batch`` and sets each request's outcome; at most ``at_once``
    commits run at a time (SQLite: one, its write lock allows no more)."""

    def __init__(self, commit: Callable[[list[Request]], None], at_once: int) -> None:
        self._commit = commit
        self.at_once = at_once
        self._forget()
        _groups.add(self)

    def _forget(self) -> None:
        """No commit in flight and none waiting: a new group, or a forked child's copy (the
        parent's callers and their leaders are not in the child)."""
        self._lock = threading.Lock()
        self._waiting: list[Request] = []
        self._in_flight = 0

    @property
    def waiting(self) -> int:
        """Requests filed and not yet taken into a commit (what a test waits for)."""
        with self._lock:
            return len(self._waiting)

    def submit(self, request: Request) -> None:
        """File ``request`` and return once the transaction holding it has ended."""
        # The group's lock by acquire and release rather than ``with``: half the cost, taken
        # twice by every enqueue.
        self._lock.acquire()
        try:
            if self._in_flight < self.at_once:  # lead at once, with every request waiting by now
                self._in_flight += 1
                waiting = self._waiting
                waiting.append(request)
                batch: list[Request] | None = waiting
                self._waiting = []
            else:
                if request._ready is None:  # only a caller that waits needs one: most lead at once
                    request._ready = threading.Lock()
                    request._ready.acquire()
                self._waiting.append(request)
                batch = None
        finally:
            self._lock.release()
        if batch is not None:
            self._lead(request, batch)
            return
        try:
            request._ready.acquire()  # woken by a leader: done, or handed the lead
        except BaseException:
            self._interrupted(request)
            raise
        self._lead_if_handed(request)

    @staticmethod
    def _handed(request: Request) -> list[Request] | None:
        """Once a leader woke ``request``: the batch it was handed to lead (None: its own commit
        has ended), after waking the callers of the commit before, which that leader left to it.
        The new leader is woken alone, so that it takes the interpreter's lock and starts its
        commit before they do: woken with it, each would first return and build its next job,
        and the ledger would stand idle meanwhile."""
        for finished in request.done:
            finished._ready.release()
        request.done = []
        return request.batch

    def _interrupted(self, request: Request) -> None:
        """A waiting caller was interrupted (Ctrl-C in the main thread). Not yet taken into a
        commit: it leaves the queue, nothing of it sent. Taken: it waits that commit out (its jobs
        may commit), and leads the batch it was handed, or the callers in it would wait forever.
        Interrupted again while it waits, it leaves that wait to a thread of its own and raises at
        once: a second Ctrl-C still stops the caller, and the others still commit."""
        with self._lock:
            if request in self._waiting:
                self._waiting.remove(request)
                return
        try:
            request._ready.acquire()
        except BaseException:
            follower = threading.Thread(target=self._follow, args=(request,), name="tether-group-commit", daemon=True)
            follower.start()
            raise
        self._lead_if_handed(request)

    def _follow(self, request: Request) -> None:
        """Wait, in an interrupted caller's place, for the leader that may hand it the lead."""
        request._ready.acquire()
        with contextlib.suppress(Exception):  # the outcome is set on each request, its caller raises it
            self._lead_if_handed(request)

    def _lead_if_handed(self, request: Request) -> None:
        batch = self._handed(request)
        if batch is not None:
            self._lead(request, batch)

    def _take(self) -> list[Request]:
        batch, self._waiting = self._waiting, []
        return batch

    def _lead(self, own: Request, batch: list[Request]) -> None:
        """Commit ``batch`` (``own`` among it), then hand the lead on with the others to wake, or
        wake them when no caller waits to lead."""
        try:
            self._commit(batch)
        except BaseException as e:
            for request in batch:
                if request.results is None and request.error is None:
                    request.error = e if isinstance(e, Exception) else _interrupted(request, e)
            raise
        finally:
            self._lock.acquire()
            try:
                if self._waiting:
                    following: list[Request] | None = self._take()
                else:
                    following = None
                    self._in_flight -= 1
            finally:
                self._lock.release()
            done = [request for request in batch if request is not own]
            if following is not None:  # the next leader wakes these once it leads
                following[0].batch = following
                following[0].done = done
                following[0]._ready.release()
            else:
                for request in done:
                    request._ready.release()


_groups: weakref.WeakSet[GroupCommit] = weakref.WeakSet()


def _forget_all() -> None:
    for group in list(_groups):
        group._forget()


os.register_at_fork(after_in_child=_forget_all)


def _interrupted(request: Request, error: BaseException) -> CommitUnknown:
    """What a caller whose leader was interrupted (KeyboardInterrupt, SystemExit) mid-commit is
    told: its jobs' fate is unknown to it."""
    return CommitUnknown(
        [job.id for job in request.jobs], f"the thread committing them was interrupted by {type(error).__name__}"
    )


def own_outcome(request: Request) -> list[InsertResult]:
    """The results of ``request`` once its transaction has ended, or its error raised."""
    if request.error is not None:
        raise _own_copy(request.error)
    assert request.results is not None  # every request of a batch is given one or the other
    return request.results


def _own_copy(error: BaseException) -> BaseException:
    """``error`` as one caller raises it: a copy, since a batch's callers may share one error (a
    database's, set on each request of a failed batch), and one exception object raised by several
    threads at once keeps one traceback that each of them writes into; ``error`` itself where it
    cannot be copied (an error of tether's own is made for each request and needs no copy)."""
    try:
        copied = copy.copy(error)
    except Exception:
        return error
    if type(copied) is not type(error) or copied.args != error.args:
        return error
    copied.__cause__, copied.__context__ = error.__cause__, error.__context__
    copied.__suppress_context__ = error.__suppress_context__
    return copied
