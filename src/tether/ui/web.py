"""The pages: each route reads through ``tether.observe`` (what the CLI reads) and renders a
server-side template; htmx (vendored) refreshes the live parts."""

from __future__ import annotations

import hmac
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import sqlalchemy as sa
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ..cli.output import age, first_line, parse_duration, progress_text, seconds, when
from ..errors import ConfigError, JobNotFound, TetherError
from ..jobtypes.target import display, file_key
from ..ledger.record import JobRecord
from ..ledger.status import JobStatus
from ..observe.durations import duration_sample
from ..observe.extractions import extractions
from ..observe.finished import failed_by_error, recent
from ..observe.health import health
from ..observe.jobs import children, on_target, show
from ..observe.pages import JobFilter, jobs_page
from ..observe.readonly import engine_of, now_of
from ..observe.resources import aws_resources
from ..observe.stuck import stuck
from ..observe.verdict import Thresholds
from ..reconcile import runs
from ..reconcile.drift import DRIFT, UNKNOWN
from .chart import duration_bars
from .driftrun import DriftRunner
from .security import SESSION_COOKIE, csrf_ok, form, session_value

if TYPE_CHECKING:
    from ..coordinator import Coordinator

HERE = Path(__file__).parent
HTMX = "htmx-2.0.11.min.js"
PAGE_SIZE = 50
DURATIONS_SAMPLE = 2_000
"""Completed jobs the durations page measures at most per request (a busy window is sampled)."""


class Pages:
    """What every page needs: the ledger, the options the server was started with, templates."""

    def __init__(
        self,
        source: Coordinator | sa.Engine,
        *,
        allow_actions: bool,
        show_payloads: bool,
        thresholds: Thresholds,
        token: str | None,
        key: bytes,
    ) -> None:
        self.source = source
        self.coordinator: Coordinator | None = None if isinstance(source, sa.Engine) else source
        self.allow_actions = allow_actions
        self.show_payloads = show_payloads
        self.thresholds = thresholds
        self.token = token
        self.key = key
        self.drift = DriftRunner(self.coordinator) if self.coordinator is not None else None
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True), auto_reload=False
        )
        # Per-type pages, where their types exist (a bare engine has no registry: every page).
        names = set(self.coordinator.registry.names()) if self.coordinator is not None else None
        extra = [("aws", "/aws", "sync_aws"), ("extractions", "/extractions", "claude_extraction")]
        self.env.globals.update(
            type_pages=[(name, href) for name, href, job_type in extra if names is None or job_type in names],
            when=when,
            age=age,
            seconds=seconds,
            first_line=first_line,
            progress_text=progress_text,
            display=display,
            htmx=HTMX,
            statuses=[s.value for s in JobStatus],
            # DB URLs are only ever shown with the password masked.
            ledger_url=engine_of(source).url.render_as_string(hide_password=True),
        )

    def render(self, request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        context.update(
            request=request,
            root=str(request.scope.get("root_path", "")).rstrip("/"),
            csrf=request.state.csrf,
            allow_actions=self.allow_actions,
            signed_in_by_token=self.token is not None,
        )
        return HTMLResponse(self.env.get_template(name).render(**context), status_code=status_code)

    def problem(self, request: Request, message: str, status_code: int = 400) -> HTMLResponse:
        return self.render(request, "problem.html", status_code, message=message)

    # -- overview --------------------------------------------------------------------------------

    def _overview(self) -> dict[str, Any]:
        verdict = health(self.source, self.thresholds)  # what `tether status` judges, alerting rules too
        s = verdict.stats
        return {
            "health": verdict,
            "stats": s,
            "recent": recent(self.source, since=timedelta(hours=1), limit=10, now=s.now),
            "stuck": stuck(self.source, now=s.now, limit=10),
            "reconciled": _last_verdict(engine_of(self.source)),
        }

    async def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", page="overview", **self._overview())

    async def overview_live(self, request: Request) -> Response:
        return self.render(request, "overview_live.html", **self._overview())

    # -- jobs ------------------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        q = request.query_params
        args = {k: q.get(k, "").strip() for k in ("status", "type", "target", "key", "window", "order", "after")}
        try:
            if args["status"] and args["status"] not in {s.value for s in JobStatus}:
                raise ConfigError(f"status {args['status']!r} is not one of {', '.join(s.value for s in JobStatus)}")
            since = None
            if args["window"]:
                since = now_of(self.source, None) - parse_duration(args["window"], "window")
            target = args["target"] or None
            if target is not None and ":" not in target:
                target = file_key(target)  # a bare path names a file target, as the CLI prints it
            where = JobFilter(
                status=args["status"] or None,
                job_type=args["type"] or None,
                target=target,
                key=args["key"] or None,
                since=since,
            )
            page = jobs_page(
                self.source, where, after=args["after"] or None, oldest_first=args["order"] == "oldest", limit=PAGE_SIZE
            )
        except TetherError as e:
            return self.render(request, "jobs.html", 400, page="jobs", args=args, listing=None, error=str(e), types=[])
        types = self.coordinator.registry.names() if self.coordinator is not None else []
        next_args = {k: v for k, v in args.items() if v and k != "after"}
        return self.render(
            request, "jobs.html", page="jobs", args=args, listing=page, error=None, next_args=next_args, types=types
        )

    async def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            job = show(self.source, job_id)
        except JobNotFound as e:
            return self.problem(request, str(e), 404)
        kids = children(self.source, job.id)
        parent = None
        if job.parent_id:
            try:
                parent = show(self.source, job.parent_id)
            except JobNotFound:
                parent = None
        neighbours = on_target(self.source, job.ordering_key) if job.ordering_key else []
        return self.render(
            request,
            "job.html",
            page="jobs",
            job=job,
            children=kids,
            parent=parent,
            neighbours=neighbours,
            result=_pretty(job.result_data) if job.result is not None else None,
            payload=_pretty(job.payload_data) if self.show_payloads else None,
            show_payloads=self.show_payloads,
            timings=_timings(job),
        )

    # -- failed, durations -------------------------------------------------------------------------

    async def failed(self, request: Request) -> Response:
        job_type = request.query_params.get("type") or None
        groups = failed_by_error(self.source, job_type=job_type)
        total = sum(g.count for g in groups)
        return self.render(request, "failed.html", page="failed", groups=groups, total=total, job_type=job_type)

    async def durations(self, request: Request) -> Response:
        window_text = request.query_params.get("window") or "1h"
        try:
            window = parse_duration(window_text, "window")
        except TetherError as e:
            return self.problem(request, str(e))
        found = duration_sample(self.source, since=window, limit=DURATIONS_SAMPLE)
        return self.render(
            request,
            "durations.html",
            page="durations",
            window=window_text,
            sample=found,
            durations=found.types,
            bars=duration_bars(found.types),
        )

    # -- per type: AWS resources, AI extractions ---------------------------------------------------

    async def aws(self, request: Request) -> Response:
        after = request.query_params.get("after") or None
        page = aws_resources(self.source, after=after, limit=PAGE_SIZE)
        state = self.drift.state() if self.drift else None
        # The last check's findings on AWS targets, by target (a finding names its target's identity).
        findings = {}
        if state is not None and state.report is not None:
            findings = {f.path: f for f in state.report.findings if f.job_type == "sync_aws"}
        return self.render(
            request,
            "aws.html",
            page="aws",
            listing=page,
            state=state,
            findings=findings,
            first=after is None,
        )

    async def extractions(self, request: Request) -> Response:
        # An hour by default: sums are exact, so a window reads each job completed in it.
        window_text = request.query_params.get("window") or "1h"
        try:
            window = parse_duration(window_text, "window")
        except TetherError as e:
            return self.problem(request, str(e))
        found = extractions(self.source, since=window)
        return self.render(request, "extractions.html", page="extractions", window=window_text, report=found)

    # -- drift -----------------------------------------------------------------------------------

    def _drift(self) -> dict[str, Any]:
        state = self.drift.state() if self.drift else None
        findings = state.report.findings if state and state.report else []
        # Drift first, then what could not be read, then what was in flight.
        rank = {s: 0 for s in DRIFT} | {UNKNOWN: 1}
        return {"state": state, "findings": sorted(findings, key=lambda f: (rank.get(f.status, 2), f.path))}

    async def drift_page(self, request: Request) -> Response:
        return self.render(request, "drift.html", page="drift", **self._drift())

    async def drift_live(self, request: Request) -> Response:
        return self.render(request, "drift_live.html", **self._drift())

    async def drift_run(self, request: Request) -> Response:
        fields = await form(request)
        if not csrf_ok(request, fields):
            return self.problem(
                request, "the form's CSRF token is missing or wrong: reload the page and try again", 403
            )
        if self.drift is None:
            return self.problem(request, "drift needs a Coordinator (its data root), not a bare engine", 409)
        self.drift.start(content=fields.get("mode") != "exists")
        return RedirectResponse(f"{request.scope.get('root_path', '')}/drift", status_code=303)

    # -- sign-in -----------------------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.render(request, "login.html", page="login", failed=False)
        fields = await form(request)

        if self.token is None or not hmac.compare_digest(fields.get("token", "").encode(), self.token.encode()):
            return self.render(request, "login.html", 401, page="login", failed=True)
        root = str(request.scope.get("root_path", "")).rstrip("/") + "/"
        response = RedirectResponse(root, status_code=303)
        response.set_cookie(
            SESSION_COOKIE, session_value(self.key, self.token), httponly=True, samesite="strict", path=root
        )
        return response


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()


def _timings(job: JobRecord) -> list[tuple[str, str]]:
    out = [("enqueued", when(job.created_at)), ("may run from", when(job.run_at))]
    if job.claimed_at:
        out.append(("last claimed", when(job.claimed_at)))
        out.append(("waited", age((job.claimed_at - job.created_at).total_seconds())))
    if job.completed_at:
        out.append((f"{job.status.value} at", when(job.completed_at)))
        if job.claimed_at:
            out.append(("last attempt took", seconds((job.completed_at - job.claimed_at).total_seconds())))
    if job.locked_by:
        out.append(("held by", f"{job.locked_by} since {when(job.locked_at)}"))
    return out


def _last_verdict(engine: sa.Engine) -> runs.Verdict | None:
    """The last reconcile run the ledger recorded (None if none, or if it cannot be read)."""
    try:
        with engine.connect() as conn:
            return runs.last(conn)
    except sa.exc.SQLAlchemyError:
        return None
