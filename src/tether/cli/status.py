"""``tether status``: outstanding work, failures, stuck jobs and a health verdict."""

from __future__ import annotations

import sqlalchemy as sa
import typer

from ..config import DEFAULT_BACKLOG_LIMIT, DEFAULT_LOCK_TIMEOUT, ENV_BACKLOG_LIMIT
from ..errors import TetherError
from ..health import Health, Thresholds, Verdict, health
from .app import app, err, out, print_json
from .output import JSON_OPTION, age, ledger, table, when

_STYLE = {Verdict.OK: "green", Verdict.WARNING: "yellow", Verdict.ERROR: "red", Verdict.UNKNOWN: "magenta"}


@app.command()
def status(
    backlog_limit: int = typer.Option(
        DEFAULT_BACKLOG_LIMIT,
        "--backlog-limit",
        envvar=ENV_BACKLOG_LIMIT,
        help="Backlog soft limit: warning at --warn-ratio of it, error at it. Jobs are never refused.",
    ),
    warn_ratio: float = typer.Option(
        0.8, "--warn-ratio", help="Fraction of the backlog limit at which the verdict becomes warning."
    ),
    lock_timeout: float = typer.Option(
        DEFAULT_LOCK_TIMEOUT, "--lock-timeout", help="Seconds after which a claimed job's lock is stale (stuck)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Health verdict, outstanding jobs by type, failed, stuck, oldest pending age.

    Exit status: 0 ok, 1 warning, 2 error, 3 could not tell (monitoring-plugin style). The
    backlog (pending + claimed) warns at --warn-ratio of --backlog-limit and is an error at
    it; any stuck job is an error; any failed job is a warning.

    Example: tether --db sqlite:///ledger/tether.db status --backlog-limit 500 || alert
    """
    try:
        thresholds = Thresholds(backlog_limit=backlog_limit, warn_ratio=warn_ratio)
        with ledger() as engine:
            h = health(engine, thresholds, lock_timeout=lock_timeout)
    except (TetherError, sa.exc.SQLAlchemyError, OSError) as e:
        # Could not tell: never let an unreadable ledger look healthy (exit 3, not 0 or 1).
        reason = " ".join(str(e).split())
        if as_json:
            print_json({"verdict": Verdict.UNKNOWN.label, "exit_code": 3, "error": reason})
        else:
            err.print(f"tether: UNKNOWN: {reason}", markup=False, soft_wrap=True)
        raise typer.Exit(Verdict.UNKNOWN.exit_code) from None
    if as_json:
        print_json(h.to_dict())
    else:
        _render(h)
    raise typer.Exit(h.verdict.exit_code)


def _render(h: Health) -> None:
    s = h.stats
    style = _STYLE[h.verdict]
    out.print(
        f"[bold {style}]{h.verdict.label.upper()}[/]  {s.outstanding} outstanding "
        f"({s.pending} pending, {s.claimed} claimed), {s.failed} failed, {s.stuck} stuck; "
        f"oldest pending {age(s.oldest_pending_age)}"
    )
    for reason in h.reasons:
        out.print(f"  - {reason}", markup=False)
    table(
        "Outstanding by type",
        ["type", "pending", "claimed", "outstanding"],
        [(b.type, b.pending, b.claimed, b.outstanding) for b in s.by_type],
        empty="no outstanding jobs",
    )
    table(
        "Checks",
        ["check", "value", "verdict", "threshold"],
        [(c.name, int(c.value), c.verdict.label, c.rule) for c in h.checks],
    )
    out.print(f"as of {when(s.now)} UTC; oldest pending enqueued {when(s.oldest_pending_at) or '-'}", markup=False)
