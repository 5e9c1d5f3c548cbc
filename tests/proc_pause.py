"""Pause points and an effect log for real worker processes (tests/test_pause.py, the kill soak).

Worker subprocesses load this with ``tether --import tests.proc_pause worker ...`` (with the
repository on PYTHONPATH); it registers no job type, only what the environment switches on:

- ``TETHER_TEST_STOP_AT=<point>`` with ``TETHER_TEST_STOP_MARKER=<file>`` and
  ``TETHER_TEST_STOP_PATH=<data path>``: the first time the worker reaches ``<point>`` for a job
  on that path it writes ``<point> <pid>`` to ``<file>`` and stops its own process
  with SIGSTOP (every thread, heartbeats included, as a VM pause or a long GC would); it goes
  on from there once the test sends SIGCONT. The points, in the order a file job meets them:

  - ``handler``: a create_file handler starts (no lock held yet);
  - ``lease_check``: inside the locked write, holding the path's lock, before the lease check;
  - ``rename``: holding the path's lock, the lease confirmed and the temp file written, before
    the rename over the data file;
  - ``before_commit``: the handler returned; the group commit that records it has not begun;
  - ``in_commit``: inside that group commit's transaction, its fenced updates done, before the
    COMMIT (holding SQLite's write lock, or PostgreSQL's row locks).

- ``TETHER_TEST_CLOCK_STOPS=1`` with a stop point: the worker's elapsed-time counter (the one its
  lease trust reads: ``clock.elapsed`` as ``tether.jobtypes.context`` and ``tether.worker.producer``
  use it) does not count the pause, as a guest's counters do not count the time its hypervisor
  holds it paused (KVM's clock stops with the guest).

- ``TETHER_TEST_EFFECT_LOG=<file>``: each rename over a data file appends ``<pid> write <path>
  <sha256 of the bytes>`` and each removal of one ``<pid> delete <path>`` (absolute paths), in
  the order they happen (under the path's lock, so the order per path is the effects' order), with
  one write(2) each so lines of concurrent processes never mix. A process killed between an
  effect and its line leaves the effect unlogged, never a line without its effect.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from typing import Any

from tether.clock import elapsed
from tether.jobtypes import Registry
from tether.jobtypes.datafiles import durable, paths

STOP_AT_ENV = "TETHER_TEST_STOP_AT"
STOP_MARKER_ENV = "TETHER_TEST_STOP_MARKER"
STOP_PATH_ENV = "TETHER_TEST_STOP_PATH"
CLOCK_STOPS_ENV = "TETHER_TEST_CLOCK_STOPS"
EFFECT_LOG_ENV = "TETHER_TEST_EFFECT_LOG"
POINTS = ("handler", "lease_check", "rename", "before_commit", "in_commit")


class _Stop:
    """Stops this process once, at one named point of a job on one data path."""

    def __init__(self, point: str, marker: str, path: str) -> None:
        if point not in POINTS:
            raise ValueError(f"{STOP_AT_ENV}={point!r}: expected one of {', '.join(POINTS)}")
        self.point, self.marker, self.path = point, marker, path
        self.fired = False
        self._lock = threading.Lock()
        self.armed = threading.local()  # in_commit: this thread's transaction completes a job
        self.paused = 0.0  # seconds stopped, for a clock that does not count them

    def at(self, point: str, path: str) -> None:
        if point != self.point or not (path == self.path or path.endswith(f"/{self.path}")):
            return  # another point, or another job's path (relative, or absolute at the rename)
        with self._lock:
            if self.fired:
                return
            self.fired = True
        part = f"{self.marker}.part"
        with open(part, "w") as f:
            f.write(f"{point} {os.getpid()}")
        os.rename(part, self.marker)  # the marker appears complete or not at all
        # To this thread: a SIGSTOP sent to the process is taken by whichever thread the kernel
        # picks, and this one could run on a little before the whole process stops.
        stopped = time.monotonic()
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)  # returns once the test sends SIGCONT
        self.paused = time.monotonic() - stopped

    def install(self) -> None:
        from tether.jobtypes.context import JobContext
        from tether.jobtypes.create_file import CreateFileType
        from tether.ledger.postgresql import PostgresBackend
        from tether.ledger.queue import Queue
        from tether.ledger.sqlite import SQLiteBackend

        run, confirm, finish = CreateFileType.run, JobContext.confirm_lease, Queue.finish_and_claim

        def run_stopping(job_type: CreateFileType, payload: Any, ctx: JobContext) -> Any:
            self.at("handler", payload.path)
            return run(job_type, payload, ctx)

        def confirm_stopping(ctx: JobContext) -> None:
            self.at("lease_check", _path_of(ctx.job))
            confirm(ctx)

        def finish_stopping(queue: Queue, worker: str, decisions: Any, **kw: Any) -> Any:
            completes = any(d.edge == "complete" and _path_of(d.job) == self.path for d in decisions)
            if completes:
                self.at("before_commit", self.path)
            self.armed.on = completes
            try:
                return finish(queue, worker, decisions, **kw)
            finally:
                self.armed.on = False

        setattr(CreateFileType, "run", run_stopping)  # noqa: B010  # a test's wrappers
        setattr(JobContext, "confirm_lease", confirm_stopping)  # noqa: B010
        setattr(Queue, "finish_and_claim", finish_stopping)  # noqa: B010
        for backend in (SQLiteBackend, PostgresBackend):
            setattr(backend, "_commit", self._commit_stopping(backend._commit))  # noqa: B010

    def _commit_stopping(self, commit: Any) -> Any:
        def commit_stopping(backend: Any, driver: Any, cur: Any) -> None:
            if getattr(self.armed, "on", False):
                self.at("in_commit", self.path)
            commit(backend, driver, cur)

        return commit_stopping


class _Effects:
    """Stands in for the ``os`` module inside tether.jobtypes.datafiles.durable: renames over data files and removals of
    data files are logged once done; ``rename`` stops there first when that is the stop point."""

    def __init__(self, log: str | None, stop: _Stop | None) -> None:
        self._fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if log else None
        self._stop = stop

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _line(self, text: str) -> None:
        if self._fd is not None:
            os.write(self._fd, f"{os.getpid()} {text}\n".encode())

    def replace(self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        if self._stop is not None:
            self._stop.at("rename", _where(dst, dst_dir_fd))
        digest = ""
        if self._fd is not None:
            fd = os.open(src, os.O_RDONLY, dir_fd=src_dir_fd)
            try:
                digest = hashlib.sha256(durable._read_all(fd, 1 << 30)).hexdigest()
            finally:
                os.close(fd)
        os.replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        self._line(f"write {_where(dst, dst_dir_fd)} {digest}")

    def unlink(self, path: Any, *, dir_fd: int | None = None) -> None:
        os.unlink(path, dir_fd=dir_fd)
        if not os.fspath(path).endswith(paths.TEMP_SUFFIX):
            self._line(f"delete {_where(path, dir_fd)}")


def _path_of(job: Any) -> str:
    return (job.ordering_key or "").removeprefix("file:")


def _where(name: Any, dir_fd: int | None) -> str:
    directory = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else ""
    return os.path.join(directory, os.fspath(name))


class _StoppedClock:
    """Stands in for ``clock.elapsed`` in the tether modules that time a lease: it leaves out the
    time the process spent stopped (``_Stop.paused``), as a paused VM's counters do."""

    def __init__(self, stop: _Stop) -> None:
        self._stop = stop

    def __call__(self) -> float:
        return elapsed() - self._stop.paused


def register(registry: Registry) -> None:
    stop = None
    if point := os.environ.get(STOP_AT_ENV):
        stop = _Stop(point, os.environ[STOP_MARKER_ENV], os.environ[STOP_PATH_ENV])
        stop.install()
        if os.environ.get(CLOCK_STOPS_ENV):
            from tether.jobtypes import context
            from tether.worker import producer

            context.elapsed = producer.elapsed = _StoppedClock(stop)  # type: ignore[attr-defined]  # a stand-in for elapsed
    log = os.environ.get(EFFECT_LOG_ENV)
    if stop is not None or log:
        durable.os = _Effects(log, stop)  # type: ignore[attr-defined,assignment]  # a stand-in for durable's os module
