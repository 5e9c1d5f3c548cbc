"""Python's cyclic garbage collector during a check: paused for the ledger pass, whose objects
form no cycles, and on again for the calls of a remote probe, whose clients leave some."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[bool]:
    """Python's cyclic garbage collector paused for the ledger pass, then restored as it was (an
    application that turned it off keeps it off); yields whether it was running. The pass makes
    a few short-lived objects per target (rows, targets, the probes' answers), none in a cycle:
    the collector's passes over them find nothing, and the full ones that they trigger scan the
    whole application's heap, a cost that grows with the application and not with the check
    (benchmarks/reconcile.py shows it in the existence check's rate)."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield running
    finally:
        if running:
            gc.enable()


@contextmanager
def running(running: bool) -> Iterator[None]:
    """The collector on again, if it ran before the check, for a remote probe's calls: an AWS
    client leaves reference cycles behind each call."""
    if running:
        gc.enable()
    try:
        yield
    finally:
        if running:
            gc.disable()
