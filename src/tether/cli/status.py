"""``tether status``: outstanding work, failures, stuck jobs and a health verdict."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from .. import config
from ..config import DEFAULT_BACKLOG_LIMIT, DEFAULT_LOCK_TIMEOUT, ENV_BACKLOG_LIMIT
from ..errors import TetherError
from ..ledger.faults import describe
from .app import JSON_OPTION, Settings, app, err, is_database_error, out, print_json
from .output import age, ledger, parse_duration, size, table, when


def _seconds(value: float | None) -> str:
    return "off" if value is None else f"{value:g}s"


def _fraction(value: float | None) -> str:
    return "off" if value is None else f"{value:g}"


def _off_is_never(seconds: float | None) -> float:
    return float("inf") if seconds is None else seconds


def _threshold(text: str, option: str, *, fraction: bool = False) -> float | None:
    """A threshold flag: ``off`` (or ``none``), else a duration (``1h``) or, for rates, a fraction."""
    if text.strip().lower() in ("off", "none", ""):
        return None
    if fraction:
        try:
            return float(text)
        except ValueError:
            raise TetherError(f"{option}: {text!r} is not a fraction such as 0.95 (or off)") from None
    return parse_duration(text, option).total_seconds()


if TYPE_CHECKING:
    from ..observe.verdict import Health, Thresholds

_STYLE = {"ok": "green", "warning": "yellow", "error": "red", "unknown": "magenta"}
_UNKNOWN_EXIT = 3  # Verdict.UNKNOWN.exit_code, before the verdict could be imported


_BACKLOG_LIMIT = typer.Option(
    DEFAULT_BACKLOG_LIMIT,
    "--backlog-limit",
    envvar=ENV_BACKLOG_LIMIT,
    help="Backlog soft limit: warning at --warn-ratio of it, error at it. Jobs are never refused.",
)
_WARN_RATIO = typer.Option(
    0.8, "--warn-ratio", help="Fraction of the backlog limit at which the verdict becomes warning."
)
_LOCK_TIMEOUT = typer.Option(
    DEFAULT_LOCK_TIMEOUT, "--lock-timeout", help="Seconds after which a claimed job's lock is stale (stuck)."
)
_WINDOW = typer.Option(
    f"{config.DEFAULT_ALERT_WINDOW:g}s",
    "--window",
    envvar=config.ENV_ALERT_WINDOW,
    help="Finished jobs the success rate and p95 run times are measured over, e.g. 1h.",
)
_PENDING_AGE_WARN = typer.Option(
    _seconds(config.DEFAULT_PENDING_AGE_WARN),
    "--pending-age-warn",
    envvar=config.ENV_PENDING_AGE_WARN,
    help="Warn when the oldest pending job has waited longer (a duration, or off).",
)
_PENDING_AGE_ERROR = typer.Option(
    _seconds(config.DEFAULT_PENDING_AGE_ERROR),
    "--pending-age-error",
    envvar=config.ENV_PENDING_AGE_ERROR,
    help="Error when the oldest pending job has waited longer (a duration, or off).",
)
_SUCCESS_RATE_WARN = typer.Option(
    _fraction(config.DEFAULT_SUCCESS_RATE_WARN),
    "--success-rate-warn",
    envvar=config.ENV_SUCCESS_RATE_WARN,
    help="Warn when completed / finished in the window falls below this fraction (or off).",
)
_SUCCESS_RATE_ERROR = typer.Option(
    _fraction(config.DEFAULT_SUCCESS_RATE_ERROR),
    "--success-rate-error",
    envvar=config.ENV_SUCCESS_RATE_ERROR,
    help="Error when completed / finished in the window falls below this fraction (or off).",
)
_P95_WARN = typer.Option(
    _seconds(config.DEFAULT_P95_WARN),
    "--p95-warn",
    envvar=config.ENV_P95_WARN,
    help="Warn when a type's p95 run time in the window is longer (a duration, or off).",
)
_P95_ERROR = typer.Option(
    _seconds(config.DEFAULT_P95_ERROR),
    "--p95-error",
    envvar=config.ENV_P95_ERROR,
    help="Error when a type's p95 run time in the window is longer (a duration, or off).",
)
_UNCLAIMED_GRACE = typer.Option(
    _seconds(config.DEFAULT_UNCLAIMED_GRACE),
    "--unclaimed-grace",
    envvar=config.ENV_UNCLAIMED_GRACE,
    help="Warn when a type's ready job waited this long with none of its type running: no worker "
    "may have the type registered (a duration, or off).",
)


@app.command()
def status(
    ctx: typer.Context,
    backlog_limit: int = _BACKLOG_LIMIT,
    warn_ratio: float = _WARN_RATIO,
    lock_timeout: float = _LOCK_TIMEOUT,
    window: str = _WINDOW,
    pending_age_warn: str = _PENDING_AGE_WARN,
    pending_age_error: str = _PENDING_AGE_ERROR,
    success_rate_warn: str = _SUCCESS_RATE_WARN,
    success_rate_error: str = _SUCCESS_RATE_ERROR,
    p95_warn: str = _P95_WARN,
    p95_error: str = _P95_ERROR,
    unclaimed_grace: str = _UNCLAIMED_GRACE,
    as_json: bool = JSON_OPTION,
) -> None:
    """Health verdict, outstanding jobs by type, failed, stuck, oldest pending age.

    Exit status: 0 ok, 1 warning, 2 error, 3 could not tell (monitoring-plugin style). The
    backlog (pending + claimed) warns at --warn-ratio of --backlog-limit and is an error at
    it; any stuck job is an error; any failed job is a warning. The alerting rules: the oldest
    pending job's age (warning past 1h), the success rate of the --window (error under 0.95),
    and each type's p95 run time in it (warning past 10s); each level is a flag, `off` turns it
    off.

    Example: tether --db sqlite:///ledger/tether.db status --backlog-limit 500 || alert
    """
    try:
        from ..observe.verdict import Thresholds

        span = _threshold(window, "--window")
        thresholds = Thresholds(
            backlog_limit=backlog_limit,
            warn_ratio=warn_ratio,
            window=config.DEFAULT_ALERT_WINDOW if span is None else span,
            pending_age_warn=_threshold(pending_age_warn, "--pending-age-warn"),
            pending_age_error=_threshold(pending_age_error, "--pending-age-error"),
            success_rate_warn=_threshold(success_rate_warn, "--success-rate-warn", fraction=True),
            success_rate_error=_threshold(success_rate_error, "--success-rate-error", fraction=True),
            p95_warn=_threshold(p95_warn, "--p95-warn"),
            p95_error=_threshold(p95_error, "--p95-error"),
            unclaimed_grace=_off_is_never(_threshold(unclaimed_grace, "--unclaimed-grace")),
        )
        h = _health(ctx.obj, thresholds, lock_timeout)
    except Exception as e:
        reason = _unreadable(e)
        if reason is None:
            raise
        _print_unknown(reason, as_json)
        raise typer.Exit(_UNKNOWN_EXIT) from None
    if as_json:
        print_json(h.to_dict())
    else:
        _render(h)
    raise typer.Exit(h.verdict.exit_code)


def _health(settings: Settings, thresholds: Thresholds, lock_timeout: float) -> Health:
    """The verdict of the ledger ``settings`` name: on a plain SQLite file through ``lite`` (the
    same statements and verdict, without loading SQLAlchemy), else through SQLAlchemy."""
    from ..observe import lite

    database_file = lite.sqlite_file(settings.db, settings.schema)
    if database_file is not None:
        return lite.health(database_file, thresholds, lock_timeout=lock_timeout)
    from ..observe.health import health

    with ledger(settings) as engine:
        return health(engine, thresholds, lock_timeout=lock_timeout)


def _unreadable(e: Exception) -> str | None:
    """Why the ledger could not be read, when ``e`` says it could not (a database, tether or OS
    error); None for any other error, which is a bug to show as it is."""
    sqlite3 = sys.modules.get("sqlite3")
    database = is_database_error(e) or (sqlite3 is not None and isinstance(e, sqlite3.Error))
    if not (database or isinstance(e, (TetherError, OSError))):
        return None
    return describe(e) if database else " ".join(str(e).split())


def _print_unknown(reason: str, as_json: bool) -> None:
    # Could not tell: never let an unreadable ledger look healthy (exit 3, not 0 or 1).
    if as_json:
        print_json({"verdict": "unknown", "exit_code": _UNKNOWN_EXIT, "error": reason})
    else:  # on stdout, where monitoring plugins read the status line; stderr for a person
        out.print(f"UNKNOWN  {reason}", markup=False, soft_wrap=True)
        if not (out.is_terminal and err.is_terminal):  # both on one screen: once is enough
            err.print(f"tether: UNKNOWN: {reason}", markup=False, soft_wrap=True)


def _render(h: Health) -> None:
    s = h.stats
    style = _STYLE[h.verdict.label]
    out.print(
        f"[bold {style}]{h.verdict.label.upper()}[/]  {s.outstanding} outstanding "
        f"({s.pending} pending, {s.claimed} claimed), {s.failed} failed, {s.stuck} stuck; "
        f"oldest pending {age(s.oldest_pending_age)}; largest pending payload {size(s.largest_pending_payload)}"
    )
    for reason in h.reasons:
        out.print(f"  - {reason}", markup=False)
    deepest = s.deepest_target
    if deepest is not None and deepest.outstanding > 1:
        out.print(
            f"  deepest target: {deepest.key} with {deepest.outstanding} outstanding jobs, which run one at "
            "a time in enqueue order",
            markup=False,
            soft_wrap=True,
        )
    if s.quarantined:
        out.print(
            f"  {s.quarantined} quarantined: a worker died while holding them; each runs alone until it completes "
            "or fails (tether jobs --json: quarantine, last_error)",
            markup=False,
        )
    table(
        "Outstanding by type",
        ["type", "pending", "claimed", "outstanding", "largest pending payload"],
        [(b.type, b.pending, b.claimed, b.outstanding, size(b.largest_payload)) for b in s.by_type],
        empty="no outstanding jobs",
    )
    table(
        "Checks",
        ["check", "value", "verdict", "threshold"],
        [(c.name, f"{c.value:g}", c.verdict.label, c.rule) for c in h.checks],
    )
    out.print(f"as of {when(s.now)} UTC; oldest pending enqueued {when(s.oldest_pending_at) or '-'}", markup=False)
