"""The drift page's reconcile: run on demand in a background thread, one at a time; the last
report (or the error that stopped it) is kept in this process's memory for the page. Before the
page's first check, the last report is the last run recorded in the ledger (by any process)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa

from .. import events
from ..reconcile import findings
from ..reconcile.check import Report, reconcile

if TYPE_CHECKING:
    from ..coordinator import Coordinator


@dataclass(frozen=True)
class DriftState:
    running: bool
    started_at: datetime | None
    report: Report | None
    error: str | None


class DriftRunner:
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started_at: datetime | None = None
        self._report: Report | None = None
        self._error: str | None = None
        self._loaded = False

    def state(self) -> DriftState:
        if not self._loaded:
            self._load()
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            return DriftState(running, self._started_at, self._report, self._error)

    def _load(self) -> None:
        """The last run the ledger recorded, read once (a page's own checks replace it)."""
        try:
            recorded = findings.last_report(self.coordinator.engine)
        except sa.exc.SQLAlchemyError:  # a read-only or older ledger: the page runs its own check
            recorded = None
        with self._lock:
            self._loaded = True
            if self._report is None:
                self._report = recorded

    def start(self, *, content: bool = True) -> bool:
        """Start a check unless one is running; returns whether this call started one."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            self._started_at = self.coordinator.clock.now()
            self._thread = threading.Thread(target=self._run, args=(content,), name="tether-ui-reconcile", daemon=True)
            self._thread.start()
        events.emit("ui_reconcile_started", content=content)
        return True

    def join(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self, content: bool) -> None:
        report, error = None, None
        try:
            report = reconcile(self.coordinator, content=content)
        except Exception as e:  # shown on the page; a failed check is never drift
            error = f"{type(e).__name__}: {e}"
        with self._lock:
            if report is not None:
                self._report, self._error = report, None
            else:
                self._error = error
