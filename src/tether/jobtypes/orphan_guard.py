"""The assistant's process group dies with its worker, however the worker dies (SIGKILL too).

tether starts the assistant through this small supervisor, by path (standard library only, so it
starts fast and imports nothing of tether)::

    python -I -S orphan_guard.py FD GRACE -- ARGV...

It leads the group (the worker starts it in a session of its own), starts ARGV in that group, and
waits, without polling, for whichever comes first: the assistant's exit (SIGCHLD, seen through a
wake-up pipe) or the end of the pipe FD, whose write end only the worker holds. The kernel closes
that end when the worker dies; the guard then terminates the group, TERM and after GRACE seconds
KILL, itself included. When the assistant exits first, the guard exits with its status, so the
worker sees the assistant's exit as before.

Why not ``PR_SET_PDEATHSIG``: it fires when the forking *thread* exits (each handler runs in a
thread of its own), and only for the direct child, never for what the child started.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

EXEC_FAILED = 127  # a shell's status for a command it could not run


def main(args: list[str]) -> int:
    watch, grace, command = int(args[0]), float(args[1]), args[3:]
    if args[2] != "--" or not command:
        os.write(2, b"usage: orphan_guard.py FD GRACE -- ARGV...\n")
        return 2
    if os.getpgrp() != os.getpid():  # started without a session of its own: never end another group
        os.setsid()
    # The worker's TERM to the group (timeout, shutdown, lost lease) is for the assistant: the
    # guard stays to report its status. The worker's KILL ends the guard with the rest.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    woken_r, woken_w = os.pipe()
    os.set_blocking(woken_w, False)
    signal.set_wakeup_fd(woken_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # before the fork: an early exit is not missed
    pid = os.fork()
    if pid == 0:
        _exec(command, watch)
    _let_go_of_stdio()
    poller = select.poll()
    poller.register(watch, select.POLLIN)
    poller.register(woken_r, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}  # blocks: no timeout, no polling loop
        if watch in ready:  # EOF (or hang-up): the worker is gone
            return _end_group(pid, grace, woken_r)
        os.read(woken_r, 512)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return _exit_like(status)


def _exec(command: list[str], watch: int) -> None:
    """In the forked child: become the assistant, with the signal dispositions a fresh process has
    (Python ignores SIGPIPE and SIGXFSZ, and the guard SIGTERM; ignored signals survive exec)."""
    try:
        os.close(watch)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(command[0], command)
    except OSError as e:
        os.write(2, f"orphan_guard: cannot run {command[0]}: {e.strerror}\n".encode())
    finally:
        os._exit(EXEC_FAILED)


def _let_go_of_stdio() -> None:
    # The assistant's pipes must close when it (and what it started) closes them, not wait for
    # the guard: its standard streams go to /dev/null.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _end_group(pid: int, grace: float, woken: int) -> int:
    """TERM the group, give the assistant ``grace`` seconds to exit, then KILL the group."""
    os.killpg(0, signal.SIGTERM)
    poller = select.poll()
    poller.register(woken, select.POLLIN)
    deadline = time.monotonic() + grace
    while (left := deadline - time.monotonic()) > 0 and not os.waitpid(pid, os.WNOHANG)[0]:
        if poller.poll(left * 1000):  # woken by SIGCHLD, or the grace is over
            os.read(woken, 512)
    os.killpg(0, signal.SIGKILL)  # the guard included: nothing of the attempt outlives its worker
    return 1  # not reached


def _exit_like(status: int) -> int:
    """Exit as the assistant did: with its code, or killed by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig  # a signal whose default is not to terminate
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
