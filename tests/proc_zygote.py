"""Starts ``tether`` worker processes by fork, for the kill soak (tests/test_postgres_kill_soak.py).

A worker started afresh spends most of a second importing tether and its libraries, so a soak of
a thousand SIGKILLs would spend most of its time importing. This process imports them once and
forks a child per worker: each child is a real process that runs the CLI's own ``main`` (``tether
ARGS``) with its output to a file, and dies by a real SIGKILL. It reads commands on stdin and
answers each on one stdout line:

- ``start <output> <arg>...`` (shell-quoted): fork a child running ``tether <arg>...``; answers its pid;
- ``wait <pid>``: wait for that child to end; answers its exit code (-N: killed by signal N).

Run as ``python tests/proc_zygote.py`` with the repository on PYTHONPATH; it exits at end of input.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
import traceback


def _child(output: str, argv: list[str]) -> None:
    code = 1
    try:
        os.setsid()  # its own session: a signal to the test's process group does not reach it
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        sys.argv = ["tether", *argv]
        from tether.cli import main

        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    # What a worker imports, imported once here; the children inherit it.
    import psycopg  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401

    import tether.cli.app
    import tether.cli.worker
    import tether.coordinator
    import tether.worker.loop  # noqa: F401

    importlib.import_module("tests.proc_pause")  # as the workers' --import names it

    for line in sys.stdin:
        command, _, rest = line.strip().partition(" ")
        if command == "start":
            output, *argv = shlex.split(rest)
            pid = os.fork()
            if pid == 0:
                _child(output, argv)
            print(pid, flush=True)
        elif command == "wait":
            _, status = os.waitpid(int(rest), 0)
            print(os.waitstatus_to_exitcode(status), flush=True)
        else:
            print(f"unknown command {command!r}", flush=True)


if __name__ == "__main__":
    main()
