"""The page's operator actions (only with ``--allow-actions``): retry one failed job, retry every
failed job of a type, cancel a pending or running job, pause or resume a job type, purge
finished jobs older than a cutoff, apply the repair plan of the drift page's last check. Each is
a GET that shows what will happen and asks to confirm, then a POST with the CSRF token that does
it; each is an event."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .. import events
from ..cli.output import parse_duration
from ..errors import CancelRefused, JobNotFound, TetherError
from ..observe.finished import failed
from ..observe.jobs import paused_types, show
from ..observe.retention import purge
from ..reconcile.plan import Plan
from .security import csrf_ok, form
from .web import Pages

Handler = Callable[[Request], Awaitable[Response]]


_PLANS_HELD = 16
"""Repair plans a confirmation page showed, held until confirmed (the newest this many)."""


class Actions:
    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        # A confirmation page's plan stays here and the form names it by digest: the plan holds
        # payloads (file contents), which never go to the browser, and a POST can only apply a
        # plan this server made.
        self._plans: OrderedDict[str, Plan] = OrderedDict()

    def guarded(self, handler: Callable[[Request, dict[str, str]], Awaitable[Response]]) -> Handler:
        """Refuse unless actions are enabled and (for a POST) the CSRF token matches."""

        async def run(request: Request) -> Response:
            if not self.pages.allow_actions or self.pages.coordinator is None:
                why = "this page is read-only: start it with `tether ui --allow-actions` to retry or purge"
                return self.pages.problem(request, why, 403)
            fields: dict[str, str] = dict(request.query_params)
            if request.method == "POST":
                fields = await form(request)
                if not csrf_ok(request, fields):
                    why = "the form's CSRF token is missing or wrong: reload the page and try again"
                    return self.pages.problem(request, why, 403)
            try:
                return await handler(request, fields)
            except TetherError as e:
                return self.pages.problem(request, str(e), 404 if isinstance(e, JobNotFound) else 409)

        return run

    def _done(self, request: Request, action: str, **facts: Any) -> Response:
        client = request.client.host if request.client else None
        events.emit("ui_action", action=action, client=client, **facts)
        return self.pages.render(request, "done.html", action=action, facts=facts)

    # -- retry one ---------------------------------------------------------------------------------

    async def retry(self, request: Request, fields: dict[str, str]) -> Response:
        job = show(self.pages.source, fields.get("job", ""))
        if request.method == "GET":
            return self.pages.render(request, "confirm_retry.html", job=job)
        assert self.pages.coordinator is not None  # guarded
        moved = self.pages.coordinator.retry(job.id)
        return self._done(request, "retry", job_id=moved.id, type=moved.type, status=moved.status.value)

    # -- cancel one -------------------------------------------------------------------------------

    async def cancel(self, request: Request, fields: dict[str, str]) -> Response:
        job = show(self.pages.source, fields.get("job", ""))
        if request.method == "GET":
            return self.pages.render(request, "confirm_cancel.html", job=job)
        assert self.pages.coordinator is not None  # guarded
        # No wait: a running job's worker records it within a second; the job's page shows it.
        [result] = self.pages.coordinator.cancel(job.id, reason=fields.get("reason") or "cancelled from the ui")
        if result.error is not None:
            raise CancelRefused(result.error)
        return self._done(request, "cancel", job_id=job.id, type=job.type, outcome=result.outcome)

    # -- retry all failed of a type ----------------------------------------------------------------

    async def retry_failed(self, request: Request, fields: dict[str, str]) -> Response:
        job_type = fields.get("type") or None
        to_retry = failed(self.pages.source, job_type=job_type, limit=None)
        if request.method == "GET":
            return self.pages.render(request, "confirm_retry_failed.html", job_type=job_type, count=len(to_retry))
        assert self.pages.coordinator is not None  # guarded
        retried, refused = [], []
        for job in to_retry:
            try:
                retried.append(self.pages.coordinator.retry(job.id).id)
            except TetherError as e:
                refused.append(f"{job.id}: {e}")
        return self._done(
            request, "retry_failed", type=job_type, retried=len(retried), refused=len(refused), errors=refused[:20]
        )

    # -- purge -------------------------------------------------------------------------------------

    async def purge(self, request: Request, fields: dict[str, str]) -> Response:
        older_text = fields.get("older_than") or "30d"
        older = parse_duration(older_text, "older than")
        statuses = [s for s in ("completed", "failed") if fields.get(s)] or ["completed"]
        dry = purge(self.pages.source, older_than=older, statuses=statuses, dry_run=True)
        if request.method == "GET":
            return self.pages.render(request, "confirm_purge.html", older_than=older_text, statuses=statuses, plan=dry)
        done = purge(self.pages.source, older_than=older, statuses=statuses)
        return self._done(request, "purge", older_than=older_text, statuses=statuses, deleted=done.total)

    # -- pause or resume a type -------------------------------------------------------------------

    async def pause(self, request: Request, fields: dict[str, str]) -> Response:
        """GET: confirm pausing ``type`` (or resuming it, when it is paused); POST: do it. Workers
        stop claiming a paused type; jobs already running finish."""
        job_type = fields.get("type", "").strip()
        held = {p["type"]: p for p in paused_types(self.pages.source)}
        if request.method == "GET":
            return self.pages.render(request, "confirm_pause.html", job_type=job_type, paused=held.get(job_type))
        coordinator = self.pages.coordinator
        assert coordinator is not None  # guarded
        if fields.get("do") == "resume":
            resumed = coordinator.resume(job_type)
            return self._done(request, "resume", type=job_type, was_paused=resumed)
        done = coordinator.pause(job_type, fields.get("reason") or "paused from the ui")
        return self._done(request, "pause", type=done.job_type)

    # -- repair the drift page's findings ------------------------------------------------------------

    async def repair(self, request: Request, fields: dict[str, str]) -> Response:
        """GET: the plan for the drift page's last report, to confirm; POST: apply the plan the
        confirmation showed (refused, nothing enqueued, if it went stale meanwhile)."""
        coordinator = self.pages.coordinator
        assert coordinator is not None  # guarded
        if request.method == "POST":
            plan = self._plans.pop(fields.get("plan", ""), None)
            if plan is None:
                why = (
                    "this server holds no such plan (it restarted, or the plan was applied): open the repair page again"
                )
                return self.pages.problem(request, why, 409)
            results = coordinator.apply_repairs(plan)
            return self._done(request, "repair", enqueued=len(results), jobs=[r.id for r in results][:50])
        state = self.pages.drift.state() if self.pages.drift else None
        if state is None or state.report is None:
            return self.pages.problem(request, "no check to repair from: run one on the drift page first", 409)
        plan = coordinator.plan_repairs(state.report)
        digest = hashlib.sha256(plan.to_json()).hexdigest()
        self._plans[digest] = plan
        while len(self._plans) > _PLANS_HELD:
            self._plans.popitem(last=False)
        return self.pages.render(request, "confirm_repair.html", plan=plan, digest=digest, report=state.report)
