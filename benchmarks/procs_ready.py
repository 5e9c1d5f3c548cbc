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
    if ready:
        (Path(ready) / str(os.getpid())).write_text(str(Path(tether.__file__).parent))
