"""``tether mcp``: the operator's questions as Model Context Protocol tools, for an AI agent.

A server over stdio (the ``mcp`` SDK, the ``tether[mcp]`` extra) whose tools are the functions the
command line reads through (``tether.observe``, ``tether.reconcile.findings``): status,
outstanding, failed (grouped by error), stuck, one job, a target's history, the last drift
findings, extraction spend. It is read-only unless started with ``--allow-actions``; then retry,
cancel and repair apply are tools too, each doing nothing unless called with ``confirm`` true, and
each logged as an ``mcp_action`` event. No output carries a payload: jobs are given without it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from . import events
from .errors import TetherError

ACTIONS_OFF = "this server is read-only: start it with `tether mcp --allow-actions` to retry, cancel or repair"
UNCONFIRMED = "nothing was done: call again with confirm=true to {what}"


class ToolServer:
    """The tools over one ledger: reads through ``engine``; actions through the coordinator that
    ``open_coordinator`` opens (only when actions are allowed, on first use)."""

    def __init__(
        self, engine: sa.Engine, open_coordinator: Callable[[], Any] | None = None, *, lock_timeout: float
    ) -> None:
        self.engine = engine
        self.open_coordinator = open_coordinator
        self.lock_timeout = lock_timeout
        self._coordinator: Any = None

    # -- reads -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The ok / warning / error verdict of ``tether status``, with its checks and counts."""
        from .observe.health import health
        from .observe.verdict import Thresholds

        return health(self.engine, Thresholds(), lock_timeout=self.lock_timeout).to_dict()

    def outstanding(self) -> dict[str, Any]:
        """Pending and claimed jobs by type, the oldest pending and the deepest target."""
        from .observe.health import stats

        return stats(self.engine, lock_timeout=self.lock_timeout).to_dict()

    def failed(self, job_type: str | None = None) -> dict[str, Any]:
        """Failed jobs grouped by their error's line, largest group first."""
        from .observe.finished import failed_by_error

        groups = failed_by_error(self.engine, job_type=job_type)
        return {
            "groups": [
                {
                    "error": g.message,
                    "count": g.count,
                    "types": g.types,
                    "last_failed_at": g.last_failed_at.isoformat(),
                    "newest_id": g.newest_id,
                }
                for g in groups
            ]
        }

    def stuck(self) -> dict[str, Any]:
        """Claimed jobs whose lock went stale: their worker died or hangs."""
        from .observe.stuck import stuck

        found = stuck(self.engine, lock_timeout=self.lock_timeout)
        return {
            "now": found.now.isoformat(),
            "lock_timeout": found.lock_timeout,
            "jobs": [{**j.to_dict(), "held_for": found.held_for(j)} for j in found.jobs],
        }

    def job(self, job_id: str) -> dict[str, Any]:
        """One job (a unique prefix or suffix of its id will do): every column but its payload,
        its tags, meta and children."""
        from .observe.jobs import children, resolve_id, show
        from .observe.tags import notes

        job_id = resolve_id(self.engine, job_id)
        job = show(self.engine, job_id)
        kids = children(self.engine, job_id)
        return {**job.to_dict(), **notes(self.engine, [job_id])[job_id], "children": [k.id for k in kids]}

    def history(self, target: str, limit: int = 50) -> dict[str, Any]:
        """Every job that touched ``target`` and every attempt of each, in time order."""
        from .observe.history import history

        found: dict[str, Any] = history(self.engine, target, limit=limit).to_dict()
        return found

    def drift(self) -> dict[str, Any]:
        """The last reconcile run's findings as recorded (no disk is read)."""
        from .reconcile.findings import last_run

        last = last_run(self.engine)
        if last is None:
            return {"run": None, "hint": "no reconcile run recorded yet: run `tether reconcile`"}
        return {
            "run": last.run_id,
            "checked_at": last.checked_at.isoformat(),
            "mode": last.mode,
            "exit_code": last.exit_code,
            "counts": last.counts,
            "findings": last.findings,
            "ignored": last.ignored,
        }

    def spend(self, hours: float = 24.0) -> dict[str, Any]:
        """What AI extractions cost in the last ``hours``: by type and model, and their verdicts."""
        from .observe.extractions import extractions

        found = extractions(self.engine, since=timedelta(hours=hours))
        return {
            "since": found.since.isoformat(),
            "cost_usd": found.cost_usd,
            "billed": found.billed,
            "unbilled": found.unbilled,
            "spend": [vars(s) for s in found.spend],
            "verdicts": [vars(v) for v in found.verdicts],
        }

    # -- actions -----------------------------------------------------------------------------

    def _acting(self, confirm: bool, what: str) -> Any:
        """The coordinator to act through, or the reason not to (a str)."""
        if self.open_coordinator is None:
            return ACTIONS_OFF
        if confirm is not True:
            return UNCONFIRMED.format(what=what)
        if self._coordinator is None:
            self._coordinator = self.open_coordinator()
        return self._coordinator

    def retry(self, job_id: str, confirm: bool = False) -> dict[str, Any]:
        """Put a failed job back to pending, its attempts reset (``confirm`` must be true)."""
        c = self._acting(confirm, f"retry {job_id}")
        if isinstance(c, str):
            return {"done": False, "reason": c}
        from .observe.jobs import resolve_id

        job = c.retry(resolve_id(self.engine, job_id))
        return _done("retry", job_id=job.id, type=job.type, status=job.status.value)

    def cancel(self, job_id: str, confirm: bool = False, reason: str | None = None) -> dict[str, Any]:
        """Cancel a pending job, or ask a running one's worker to stop (``confirm`` must be true)."""
        c = self._acting(confirm, f"cancel {job_id}")
        if isinstance(c, str):
            return {"done": False, "reason": c}
        from .observe.jobs import resolve_id

        [result] = c.cancel(resolve_id(self.engine, job_id), reason=reason or "cancelled through tether mcp")
        return _done("cancel", job_id=result.job_id, outcome=result.outcome)

    def repair_apply(self, confirm: bool = False) -> dict[str, Any]:
        """Enqueue the repair jobs for the last reconcile run's findings (``confirm`` must be
        true); refused if a planned target has had a job since."""
        c = self._acting(confirm, "apply the repair plan of the last reconcile run")
        if isinstance(c, str):
            return {"done": False, "reason": c}
        from .reconcile.findings import last_report

        report = last_report(self.engine)
        if report is None:
            return {"done": False, "reason": "no reconcile run recorded: run `tether reconcile` first"}
        results = c.apply_repairs(c.plan_repairs(report))
        return _done("repair_apply", enqueued=len(results), jobs=[r.id for r in results][:50])

    def close(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()


def _done(action: str, **facts: Any) -> dict[str, Any]:
    events.emit("mcp_action", action=action, **facts)
    return {"done": True, "action": action, **facts}


READS = ("status", "outstanding", "failed", "stuck", "job", "history", "drift", "spend")
ACTIONS = ("retry", "cancel", "repair_apply")


def build(tools: ToolServer, *, allow_actions: bool) -> Any:
    """The MCP server of ``tools``: the reads always, the actions only when allowed. A tool that
    meets a TetherError (an unknown job id) answers with its message as the tool's error."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(
        "tether",
        instructions="Read a tether job ledger: status, failures, stuck jobs, drift, spend. Payloads are never shown.",
    )
    for name in READS + (ACTIONS if allow_actions else ()):
        server.tool(name=name)(_answering(getattr(tools, name)))
    return server


def _answering(method: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    import functools

    @functools.wraps(method)
    def tool(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return method(*args, **kwargs)
        except TetherError as e:
            return {"error": str(e)}

    return tool
