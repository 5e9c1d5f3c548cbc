"""Job types and a worker entry point for the PostgreSQL process tests and benchmarks/pg_drain.py.

Worker subprocesses load the job types with ``tether --import tests.pg_jobtypes worker ...`` (with
the repository on PYTHONPATH).

Job types added by ``register``:
- ``pg_append``: appends ``<job id> <pid>`` as one line to ``log`` with O_APPEND (one write(2),
  so lines of concurrent processes never mix), then optionally sleeps ``hold`` seconds, so a
  SIGKILL can land between the effect and the completion.
- ``pg_noop``: does nothing (drain throughput).

``python -m tests.pg_jobtypes --db URL --root DIR [--poll-interval S] [--no-listen]`` runs a
worker like ``tether worker`` but with the LISTEN/NOTIFY wake-up installed explicitly
(``wakeup.wakeup_for``, or a ``PgWakeup`` that never listens), so the wake-up tests do not
depend on which wake-up the coordinator picks by default.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, ClassVar

from tether.jobtypes import JobType, Payload, Registry

if TYPE_CHECKING:
    from tether.jobtypes.context import JobContext


class PgAppend(Payload):
    job_type: ClassVar[str] = "pg_append"

    log: str  # absolute path of the effect log
    hold: float = 0.0  # seconds to wait after the effect, before the completion commits


class PgAppendType(JobType[PgAppend]):
    name = "pg_append"
    payload_model = PgAppend

    def run(self, payload: PgAppend, ctx: JobContext) -> None:
        fd = os.open(payload.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.job.id} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        if payload.hold:
            time.sleep(payload.hold)  # widens the window a SIGKILL can hit; not a race fix
        return None


class PgNoop(Payload):
    job_type: ClassVar[str] = "pg_noop"

    n: int = 0


class PgNoopType(JobType[PgNoop]):
    name = "pg_noop"
    payload_model = PgNoop

    def run(self, payload: PgNoop, ctx: JobContext) -> None:
        return None


def register(registry: Registry) -> None:
    registry.register(PgAppendType())
    registry.register(PgNoopType())


def main(argv: list[str] | None = None) -> None:
    from tether import Coordinator
    from tether.jobtypes import default_registry
    from tether.ledger.wakeup import PgWakeup, wakeup_for

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--lock-timeout", type=float, default=300.0)
    parser.add_argument("--no-listen", action="store_true", help="notifications are never received")
    args = parser.parse_args(argv)
    registry = default_registry()
    register(registry)
    with Coordinator.open(args.db, root=args.root, registry=registry, lock_timeout=args.lock_timeout) as c:
        c.queue.wakeup = PgWakeup(c.engine, listen=False) if args.no_listen else wakeup_for(c.engine)
        try:
            c.worker(poll_interval=args.poll_interval).run()
        finally:
            c.queue.wakeup.close()


if __name__ == "__main__":
    main()
