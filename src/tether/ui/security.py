"""Who may use the page: the Host check (DNS rebinding), the token login, CSRF, the headers.

A page bound to loopback needs no token; any other address needs one (``tether ui
--token-file``). A browser signs in once with the token and gets an HttpOnly, SameSite=Strict
cookie holding an HMAC of it (never the token itself); scripts send ``Authorization: Bearer``.
Every POST carries a CSRF token: an HMAC of a per-browser random cookie, so another site can
neither read nor forge it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import parse_qs

from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from ..errors import ConfigError

SESSION_COOKIE = "tether_session"
CSRF_COOKIE = "tether_csrf"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN = 16

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(path: str) -> str:
    """The token in ``path`` (surrounding whitespace dropped); too short or unreadable: an error."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ConfigError(f"--token-file: cannot read {path}: {e.strerror}") from e
    if len(token) < MIN_TOKEN:
        raise ConfigError(f"--token-file: the token in {path} has {len(token)} characters; use at least {MIN_TOKEN}")
    return token


def bind_hosts(host: str, token: str | None, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The Host header names a page bound to ``host`` answers. Loopback answers its own names;
    any other address needs a token, and a wildcard one (0.0.0.0) the names clients use."""
    names = tuple(h.lower() for h in extra)
    if is_loopback(host):
        return tuple(dict.fromkeys((host.lower(), *LOOPBACK_HOSTS, *names)))
    if token is None:
        raise ConfigError(
            f"--host {host} is not a loopback address: anyone who reaches it could read the ledger; "
            "give --token-file (a file holding a secret token of 16+ characters), or bind to 127.0.0.1"
        )
    if host in ("0.0.0.0", "::", ""):
        if not names:
            raise ConfigError(
                f"--host {host} listens on every address: name the host names clients use (--allowed-host)"
            )
        return names
    return tuple(dict.fromkeys((host.lower(), *names)))


def _host_name(header: str) -> str:
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8787
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard(BaseHTTPMiddleware):
    """Host check, then sign-in, then the security headers on every answer."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: tuple[str, ...] | None, token: str | None, key: bytes) -> None:
        super().__init__(app)
        self.allowed_hosts = allowed_hosts
        self.token = token
        self.key = key

    async def dispatch(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await self._checked(request, call_next)
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(
                CSRF_COOKIE, request.state.csrf_seed, httponly=True, samesite="strict", path=_root(request)
            )
        return response

    async def _checked(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        request.state.csrf_seed = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        request.state.csrf = csrf_token(self.key, request.state.csrf_seed)
        if self.allowed_hosts is not None:
            host = _host_name(request.headers.get("host", ""))
            if host not in self.allowed_hosts:
                return PlainTextResponse(f"Host {host!r} is not one this page answers to\n", status_code=421)
        if self.token is None or request.url.path.endswith(("/login", "/static/tether.css", "/favicon.ico")):
            return await call_next(request)
        if self.signed_in(request):
            return await call_next(request)
        if request.method == "GET" and "hx-request" not in request.headers:
            return RedirectResponse(f"{_root(request)}login", status_code=303)
        return PlainTextResponse("sign in first (Authorization: Bearer <token>)\n", status_code=401)

    def signed_in(self, request: Request) -> bool:
        assert self.token is not None
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), self.token.encode()):
            return True
        return hmac.compare_digest(request.cookies.get(SESSION_COOKIE, ""), session_value(self.key, self.token))


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/") + "/"


def session_value(key: bytes, token: str) -> str:
    return hmac.new(key, b"session:" + token.encode(), hashlib.sha256).hexdigest()


def csrf_token(key: bytes, seed: str) -> str:
    return hmac.new(key, b"csrf:" + seed.encode(), hashlib.sha256).hexdigest()


async def form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the first value of each), read without python-multipart."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def csrf_ok(request: Request, fields: dict[str, str]) -> bool:
    seed = request.cookies.get(CSRF_COOKIE)
    given = fields.get("csrf", "")
    return bool(seed) and hmac.compare_digest(given, request.state.csrf)
