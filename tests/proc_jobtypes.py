"""Job types and fault hooks for the real-process tests (tests/test_processes.py).

Worker subprocesses load this with ``tether --import tests.proc_jobtypes worker ...`` (with the
repository on PYTHONPATH); the test process loads it by file path to enqueue the same types.

Job types added by ``register``:
- ``append_id``: appends ``<job id> <pid>`` as one line to ``log`` with O_APPEND, so the test can
  count how many times each job's effect was applied.
- ``poison_or_not``: appends ``<job id> <pid>`` to ``log`` like ``append_id``; then, if the payload
  says ``poison``, ends its own process with ``os._exit(1)`` (as a segfaulting C extension or the
  OOM killer would end it: no exception, no finally, no outcome recorded).
- ``scripted``: acts on the data path ``path`` (writing nothing); what each attempt does is the
  payload's ``script`` entry for its attempt number: ``error`` raises, ``hang`` waits at
  checkpoints until the job's timeout cancels it, ``die`` SIGKILLs its own process mid-run (as
  the OOM killer would), ``ok`` returns.
- ``slow``: appends ``<job id> <pid>`` to ``started`` (one line per run), then waits until
  ``release`` exists, calling ``ctx.checkpoint()`` every few milliseconds (the shape of a
  cancellable long job).

Fault hooks, switched on per worker process by environment variables (the test process, and any
worker started without them, get the plain behaviour):
- ``TETHER_TEST_FAST_RETRY=<seconds>``: a retried job waits this long instead of the backoff.
- ``TETHER_TEST_HANG_BEFORE_RENAME=<marker>``: ``DataFile.write`` writes and fsyncs its temp
  file as usual, then, instead of renaming it, writes the temp path to ``<marker>`` and blocks
  forever, so the test can SIGKILL the worker in the middle of the atomic write.
- ``TETHER_TEST_SYNC_LOG=<log>``: every directory fsync (``fsync <inode>``, once it returned),
  rename of a data file (``rename <directory inode> <name>``) and group commit (``record <ids of
  the jobs it completes>``, before the commit) is appended to ``<log>`` in the order it happens;
  with ``TETHER_TEST_KILL_AT_DIR_SYNC=<n>`` the process SIGKILLs itself instead of the n-th
  directory fsync (renames done, their directory not fsynced, their jobs not recorded).
- ``TETHER_TEST_KILL_AFTER_WRITE=<marker>``: ``create_file`` runs the real handler (the rename
  has happened) and then, if ``<marker>`` exists, deletes it and SIGKILLs its own process before
  the completion can commit. Deleting the marker first makes this happen once only.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tether.errors import PermanentError
from tether.jobtypes import JobType, Payload, Registry
from tether.jobtypes.create_file import CreateFile, CreateFileType
from tether.jobtypes.datafiles import durable
from tether.jobtypes.target import Target

if TYPE_CHECKING:
    from tether.jobtypes.context import JobContext

HANG_ENV = "TETHER_TEST_HANG_BEFORE_RENAME"
KILL_ENV = "TETHER_TEST_KILL_AFTER_WRITE"
SYNC_LOG_ENV = "TETHER_TEST_SYNC_LOG"
KILL_AT_DIR_SYNC_ENV = "TETHER_TEST_KILL_AT_DIR_SYNC"
FAST_RETRY_ENV = "TETHER_TEST_FAST_RETRY"
KILL_AT_ENV = "TETHER_TEST_KILL_AT_APPEND"  # SIGKILL this process right after its Nth append_id effect
SLOW_JOB_DEADLINE = 60.0  # a slow job never outlives a broken test by more than this


class AppendId(Payload):
    job_type: ClassVar[str] = "append_id"

    log: str  # absolute path of the effect log (outside the data root)
    gate: str | None = None  # absolute path whose existence lets the handler start


class AppendIdType(JobType[AppendId]):
    name = "append_id"
    payload_model = AppendId

    def run(self, payload: AppendId, ctx: JobContext) -> dict[str, Any]:
        deadline = time.monotonic() + SLOW_JOB_DEADLINE
        while payload.gate and not os.path.exists(payload.gate) and time.monotonic() < deadline:
            ctx.checkpoint()
            time.sleep(0.01)
        # One write(2) of a short line with O_APPEND: lines from concurrent processes never mix.
        fd = os.open(payload.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.job.id} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        self.applied += 1
        if self.applied == self.kill_at:  # the effect happened; its completion may not have committed
            os.kill(os.getpid(), signal.SIGKILL)
        return {"pid": os.getpid()}

    def __init__(self, kill_at: int | None = None) -> None:
        self.applied = 0
        self.kill_at = kill_at


class PoisonOrNot(Payload):
    job_type: ClassVar[str] = "poison_or_not"

    log: str  # absolute path of the run log (outside the data root)
    n: int  # the job's place in the test's list
    poison: bool = False


class PoisonOrNotType(JobType[PoisonOrNot]):
    name = "poison_or_not"
    payload_model = PoisonOrNot

    def run(self, payload: PoisonOrNot, ctx: JobContext) -> dict[str, Any]:
        fd = os.open(payload.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.job.id} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        if payload.poison:
            os._exit(1)
        return {"n": payload.n}


class Scripted(Payload):
    job_type: ClassVar[str] = "scripted"

    path: str  # the data path it acts on (its target); nothing is written there
    script: list[str]  # per attempt number: error, hang, die or ok (the last entry repeats)


class ScriptedType(JobType[Scripted]):
    name = "scripted"
    payload_model = Scripted

    def target(self, payload: Scripted) -> Target:
        return Target.file(payload.path)

    def run(self, payload: Scripted, ctx: JobContext) -> dict[str, Any]:
        attempt = ctx.job.attempts
        step = payload.script[min(attempt, len(payload.script)) - 1]
        if step == "error":
            raise RuntimeError(f"scripted error on attempt {attempt}")
        if step == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        deadline = time.monotonic() + SLOW_JOB_DEADLINE
        while step != "ok" and time.monotonic() < deadline:  # hang: the job's timeout cancels it
            ctx.checkpoint()
            time.sleep(0.005)
        return {"attempt": attempt}


class Slow(Payload):
    job_type: ClassVar[str] = "slow"

    started: str  # absolute path a line is appended to when the handler starts
    release: str  # absolute path whose existence lets the handler return


class SlowType(JobType[Slow]):
    name = "slow"
    payload_model = Slow

    def run(self, payload: Slow, ctx: JobContext) -> dict[str, Any]:
        fd = os.open(payload.started, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.job.id} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        deadline = time.monotonic() + SLOW_JOB_DEADLINE
        checks = 0
        while not os.path.exists(payload.release):
            ctx.checkpoint()
            checks += 1
            if time.monotonic() > deadline:
                raise PermanentError("slow test job was never released")
            time.sleep(0.005)
        return {"checkpoints": checks}


class KillAfterWriteType(CreateFileType):
    """The real create_file handler, then SIGKILL of this process once (see the module doc)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def run(self, payload: CreateFile, ctx: JobContext) -> dict[str, Any]:
        result = super().run(payload, ctx)
        try:
            os.unlink(self.marker)
        except FileNotFoundError:
            return result
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: the process was killed")


class _HangOnReplace:
    """Stands in for the ``os`` module inside tether.jobtypes.datafiles.durable: everything passes through except
    ``replace``, which reports the temp path and never returns."""

    def __init__(self, marker: str) -> None:
        self._marker = marker

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def replace(self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        tmp = Path(self._marker + ".part")
        where = os.readlink(f"/proc/self/fd/{src_dir_fd}") if src_dir_fd is not None else ""
        tmp.write_text(os.path.join(where, os.fspath(src)))
        os.rename(tmp, self._marker)  # the marker appears complete or not at all
        threading.Event().wait()


class _SyncLog:
    """The order of directory fsyncs, renames and group commits in a worker (see the module doc)."""

    def __init__(self, log: str, kill_at: int | None) -> None:
        self.fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.kill_at, self.dir_syncs = kill_at, 0
        self.real_fsync = durable.fsync_fd

    def line(self, text: str) -> None:
        os.write(self.fd, f"{text}\n".encode())  # one write(2) each: lines never mix

    def fsync(self, fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self.dir_syncs += 1
            if self.dir_syncs == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        self.real_fsync(fd)
        if stat.S_ISDIR(st.st_mode):
            self.line(f"fsync {st.st_ino}")

    def install(self) -> None:
        from tether.ledger.queue import Queue

        durable.fsync_fd = self.fsync
        durable.os = _LogReplace(self)  # type: ignore[attr-defined,assignment]  # a stand-in for durable's os module
        finish = Queue.finish_and_claim

        def finish_and_claim(queue: Queue, worker: str, decisions: Any, **kw: Any) -> Any:
            self.line("record " + " ".join(d.job.id for d in decisions if d.edge == "complete"))
            return finish(queue, worker, decisions, **kw)

        setattr(Queue, "finish_and_claim", finish_and_claim)  # noqa: B010  # a test's wrapper


class _LogReplace:
    """Stands in for the ``os`` module inside tether.jobtypes.datafiles.durable: ``replace`` is logged once done."""

    def __init__(self, log: _SyncLog) -> None:
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def replace(self, src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
        os.replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        assert dst_dir_fd is not None
        self._log.line(f"rename {os.fstat(dst_dir_fd).st_ino} {os.fspath(dst)}")


def register(registry: Registry) -> None:
    kill_at = os.environ.get(KILL_AT_ENV)
    registry.register(AppendIdType(int(kill_at) if kill_at else None))
    registry.register(SlowType())
    registry.register(ScriptedType())
    if fast := os.environ.get(FAST_RETRY_ENV):
        from tether.worker.retry import RetryPolicy

        setattr(RetryPolicy, "delay", lambda self, attempt: timedelta(seconds=float(fast)))  # noqa: B010  # a test's stand-in
    registry.register(PoisonOrNotType())
    if marker := os.environ.get(KILL_ENV):
        registry.register(KillAfterWriteType(marker))
    if log := os.environ.get(SYNC_LOG_ENV):
        kill_at_sync = os.environ.get(KILL_AT_DIR_SYNC_ENV)
        _SyncLog(log, int(kill_at_sync) if kill_at_sync else None).install()
    if marker := os.environ.get(HANG_ENV):
        durable.os = _HangOnReplace(marker)  # type: ignore[attr-defined,assignment]  # a stand-in for durable's os module
