"""``tether ui``: the operator's questions and the drift on a web page (optional extra ``tether[ui]``).

``tether.ui.app(coordinator)`` is an ASGI app, served by ``tether ui`` or mounted inside an
application's own (``Mount("/tether", app=tether.ui.app(coordinator))``). It is read-only unless
``allow_actions``; every page reads through ``tether.observe``, as the CLI does.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import TYPE_CHECKING

import sqlalchemy as sa
from prometheus_client import make_asgi_app
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ..observe import metrics
from ..observe.verdict import Thresholds
from .actions import Actions
from .security import LOOPBACK_HOSTS, Guard, bind_hosts, is_loopback, read_token
from .web import HERE, Pages

if TYPE_CHECKING:
    from ..coordinator import Coordinator

__all__ = ["LOOPBACK_HOSTS", "app", "bind_hosts", "is_loopback", "read_token"]


def app(
    source: Coordinator | sa.Engine,
    *,
    allow_actions: bool = False,
    show_payloads: bool = False,
    token: str | None = None,
    allowed_hosts: Iterable[str] | None = LOOPBACK_HOSTS,
    thresholds: Thresholds | None = None,
) -> Starlette:
    """The page over ``source`` (a ``Coordinator``; a bare ``Engine`` gives the read-only pages
    without drift). ``token``: required sign-in (bearer header or the login form's cookie).
    ``allowed_hosts``: the ``Host`` names answered (DNS rebinding); ``None`` leaves that check to
    the application that mounts this one. Payloads are shown only with ``show_payloads``."""
    key = secrets.token_bytes(32)  # signs session and CSRF cookies; a restart signs everyone out
    pages = Pages(
        source,
        allow_actions=allow_actions,
        show_payloads=show_payloads,
        thresholds=thresholds or Thresholds(),
        token=token,
        key=key,
    )
    actions = Actions(pages)
    routes = [
        Route("/", pages.overview),
        Route("/live/overview", pages.overview_live),
        Route("/jobs", pages.jobs),
        Route("/jobs/{job_id}", pages.job),
        Route("/workers", pages.workers),
        Route("/live/workers", pages.workers_live),
        Route("/failed", pages.failed),
        Route("/durations", pages.durations),
        Route("/aws", pages.aws),
        Route("/extractions", pages.extractions),
        Route("/drift", pages.drift_page),
        Route("/live/drift", pages.drift_live),
        Route("/drift/run", pages.drift_run, methods=["POST"]),
        Route("/actions/retry", actions.guarded(actions.retry), methods=["GET", "POST"]),
        Route("/actions/retry-failed", actions.guarded(actions.retry_failed), methods=["GET", "POST"]),
        Route("/actions/cancel", actions.guarded(actions.cancel), methods=["GET", "POST"]),
        Route("/actions/pause", actions.guarded(actions.pause), methods=["GET", "POST"]),
        Route("/actions/purge", actions.guarded(actions.purge), methods=["GET", "POST"]),
        Route("/actions/repair", actions.guarded(actions.repair), methods=["GET", "POST"]),
        Route("/login", pages.login, methods=["GET", "POST"]),
        # Browsers ask for /favicon.ico on every page whatever the page links: answered, not a 404.
        Route("/favicon.ico", _favicon),
        # The ledger's Prometheus numbers, behind the same Host check and sign-in as the pages: one
        # collector for the app's life, as `tether metrics --serve` keeps, so its counters and
        # histograms are cumulative from the app's start (rate() over them) and each scrape reads
        # only what finished since the one before.
        Route("/metrics", _Scrape(make_asgi_app(metrics.registry(source, process=False, thresholds=pages.thresholds)))),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    hosts = None if allowed_hosts is None else tuple(h.lower().strip("[]") for h in allowed_hosts)
    guard = Middleware(Guard, allowed_hosts=hosts, token=token, key=key)
    web = Starlette(routes=routes, middleware=[guard])
    web.state.pages = pages  # tests and the CLI reach the drift runner through it
    return web


async def _favicon(request: Request) -> Response:
    return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")


class _Scrape:
    """prometheus-client's ASGI app as a route's endpoint: Starlette would take the bare function
    for a request handler, an instance is served as the ASGI app it is."""

    def __init__(self, asgi: ASGIApp) -> None:
        self.asgi = asgi

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.asgi(scope, receive, send)
