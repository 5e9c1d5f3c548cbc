"""The job types of benchmarks/procs.py's worker processes, and their "ready" signal.

Loaded with ``tether --import benchmarks.procs_ready worker ...`` (the repository on PYTHONPATH):
``register`` adds tests/pg_jobtypes.py's ``pg_noop``; ``schedules`` (called by the CLI once the
ledger is open, just before the worker starts) writes a file named by this process's pid into
``$TETHER_BENCH_READY``, holding the path of the tether package it imported, so the benchmark
enqueues only once every process is past its imports.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests import pg_jobtypes


def register(registry: Any) -> None:
    pg_jobtypes.register(registry)


def schedules(coordinator: Any) -> None:
    import tether

    ready = os.environ.get("TETHER_BENCH_READY")
    if ready:  # written whole, then named: the benchmark never reads a half-written file
        temp = Path(ready) / f".{os.getpid()}"
        temp.write_text(str(Path(tether.__file__).parent))
        temp.rename(temp.with_name(str(os.getpid())))


def _profile(out: Path) -> None:
    """Wall time a worker process spends waiting for the write lock, inside write transactions
    and in handlers, written to ``out`` (JSON) when it exits (``--profile``)."""
    import atexit
    import json
    import time
    from contextlib import contextmanager

    from tether.ledger import backend
    from tether.worker import executor

    try:  # the driver split: SQLite's in its own module
        from tether.ledger.sqlite import SQLiteBackend
    except ImportError:  # a tree from before it (the "before" side of a comparison)
        SQLiteBackend = backend.SQLiteBackend  # type: ignore[attr-defined]  # noqa: N806

    spent = {"lock_wait": 0.0, "in_write": 0.0, "commit": 0.0, "handlers": 0.0, "writes": 0, "waits": 0}
    commit = SQLiteBackend._commit

    def timed_commit(self: Any, driver: Any, cur: Any) -> None:
        start = time.perf_counter()
        try:
            commit(self, driver, cur)
        finally:
            spent["commit"] += time.perf_counter() - start

    when_unlocked = SQLiteBackend._when_unlocked
    run_handler = executor.Executor.run

    def timed_unlocked(self: Any, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return when_unlocked(self, *args)
        finally:
            spent["lock_wait"] += time.perf_counter() - start
            spent["waits"] += 1

    # A write transaction: Backend._transaction (one run of transact), or, in a tree from before
    # it, the context manager Backend.write().
    transaction = getattr(backend.Backend, "_transaction", None)
    write = backend.Backend.write

    def timed_transaction(self: Any, body: Any, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return transaction(self, body, *args)  # type: ignore[misc]
        finally:
            spent["in_write"] += time.perf_counter() - start
            spent["writes"] += 1

    @contextmanager
    def timed_write(self: Any, conn: Any = None) -> Any:
        start = time.perf_counter()
        try:
            with write(self, conn) as cur:
                yield cur
        finally:
            spent["in_write"] += time.perf_counter() - start
            spent["writes"] += 1

    def timed_handler(self: Any, job: Any, ctx: Any) -> Any:
        outcome, duration = run_handler(self, job, ctx)
        spent["handlers"] += duration
        return outcome, duration

    SQLiteBackend._when_unlocked = timed_unlocked  # type: ignore[method-assign]
    SQLiteBackend._commit = timed_commit  # type: ignore[method-assign]
    if transaction is not None:
        backend.Backend._transaction = timed_transaction  # type: ignore[method-assign]
    else:
        backend.Backend.write = timed_write  # type: ignore[method-assign,assignment]
    executor.Executor.run = timed_handler  # type: ignore[method-assign]
    atexit.register(lambda: out.write_text(json.dumps(spent)))


if os.environ.get("TETHER_BENCH_PROFILE"):
    _profile(Path(os.environ["TETHER_BENCH_PROFILE"]) / f"{os.getpid()}.json")
