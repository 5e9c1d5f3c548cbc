"""The health verdict of a ledger: ok / warning / error, with the thresholds that decided it.

Exit codes follow the monitoring-plugin (Nagios) convention so ``tether status`` can be used as
any health check: 0 ok, 1 warning, 2 error, 3 could not tell. The backlog limit is *soft*: jobs
are never refused because of it, it only changes the verdict.

No SQLAlchemy here: ``health`` (SQLAlchemy) and ``lite`` (a SQLite file, stdlib ``sqlite3``)
read the ledger, and both judge it with ``assess``. The run times the p95 rule reads are
summarised here too (``run_times_of``, ``percentile``), as ``durations`` summarises them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .. import config
from ..errors import ConfigError
from .backlog import Stats


class Verdict(Enum):
    OK = ("ok", 0)
    WARNING = ("warning", 1)
    ERROR = ("error", 2)
    UNKNOWN = ("unknown", 3)
    """The ledger could not be read: the health is not known (never reported as ok)."""

    def __init__(self, label: str, exit_code: int) -> None:
        self.label = label
        self.exit_code = exit_code


@dataclass(frozen=True)
class Thresholds:
    """When the verdict changes. Defaults: backlog soft limit 100, warning at 80% of it, error
    at 100%; any stuck job is an error; any failed job is a warning; and the alerting rules of
    docs/design.md ("The operator's questions") over the last hour: oldest pending job over 1 h a
    warning, success rate under 95% an error, p95 run time of a type over 10 s a warning (each
    level can be set or turned off)."""

    backlog_limit: int = config.DEFAULT_BACKLOG_LIMIT
    warn_ratio: float = 0.8
    window: float = config.DEFAULT_ALERT_WINDOW
    pending_age_warn: float | None = config.DEFAULT_PENDING_AGE_WARN
    pending_age_error: float | None = config.DEFAULT_PENDING_AGE_ERROR
    success_rate_warn: float | None = config.DEFAULT_SUCCESS_RATE_WARN
    success_rate_error: float | None = config.DEFAULT_SUCCESS_RATE_ERROR
    p95_warn: float | None = config.DEFAULT_P95_WARN
    p95_error: float | None = config.DEFAULT_P95_ERROR
    unclaimed_grace: float = config.DEFAULT_UNCLAIMED_GRACE

    def __post_init__(self) -> None:
        if self.backlog_limit < 1:
            raise ConfigError(f"backlog limit must be at least 1, not {self.backlog_limit}")
        if not 0 < self.warn_ratio <= 1:
            raise ConfigError(f"backlog warning ratio must be in (0, 1], not {self.warn_ratio}")
        if not self.window > 0:
            raise ConfigError(f"the alert window must be positive, not {self.window}")
        for name in ("success_rate_warn", "success_rate_error"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ConfigError(f"{name.replace('_', '-')} must be a fraction in [0, 1], not {value}")
        for name in ("pending_age_warn", "pending_age_error", "p95_warn", "p95_error"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"{name.replace('_', '-')} must be a number of seconds >= 0, not {value}")

    @property
    def backlog_warn(self) -> int:
        """Outstanding jobs at which the verdict becomes warning (80 of 100 by default)."""
        return max(1, int(self.backlog_limit * self.warn_ratio + 0.5))

    def to_dict(self) -> dict[str, Any]:
        return {
            "backlog_limit": self.backlog_limit,
            "backlog_warn": self.backlog_warn,
            "stuck_error": 1,
            "failed_warn": 1,
            "window": self.window,
            "pending_age_warn": self.pending_age_warn,
            "pending_age_error": self.pending_age_error,
            "success_rate_warn": self.success_rate_warn,
            "success_rate_error": self.success_rate_error,
            "p95_warn": self.p95_warn,
            "p95_error": self.p95_error,
            "unclaimed_grace": self.unclaimed_grace,
        }


def run_times_of(rows: Iterable[Any]) -> dict[str, list[float]]:
    """``(type, seconds)`` rows (claimed_at -> completed_at of completed jobs) as each type's run
    times, to the millisecond."""
    by_type: dict[str, list[float]] = {}
    for name, value in rows:
        # Millisecond resolution: julianday() arithmetic is not exact below it.
        by_type.setdefault(name, []).append(max(0.0, round(float(value), 3)))
    return by_type


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]


@dataclass(frozen=True)
class Activity:
    """What finished in the alert window: how many completed and failed, and the p95 run time
    (seconds) of each type's completed jobs."""

    window: float
    completed: int = 0
    failed: int = 0
    p95_by_type: dict[str, float] = field(default_factory=dict)

    @property
    def success_rate(self) -> float | None:
        """Completed / finished in the window; None when nothing finished."""
        finished = self.completed + self.failed
        return self.completed / finished if finished else None


def activity_of(window: float, finished: Iterable[Any], run_times: Iterable[Any]) -> Activity:
    """``Activity`` from the window's rows: (status, count) of the finished jobs, and (type,
    seconds) of each completed job's run time."""
    counts = dict(finished)
    p95 = {name: percentile(sorted(values), 95) for name, values in run_times_of(run_times).items()}
    return Activity(window, counts.get("completed", 0), counts.get("failed", 0), p95)


@dataclass(frozen=True)
class HealthCheck:
    """One rule's finding: what was measured, against which threshold, with what verdict."""

    name: str
    value: float
    verdict: Verdict
    rule: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "verdict": self.verdict.label, "rule": self.rule}


@dataclass(frozen=True)
class Health:
    verdict: Verdict
    checks: list[HealthCheck]
    thresholds: Thresholds
    stats: Stats

    @property
    def reasons(self) -> list[str]:
        """One line per check that is not ok."""
        return [f"{c.name} {c.value:g}: {c.rule}" for c in self.checks if c.verdict is not Verdict.OK]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.label,
            "exit_code": self.verdict.exit_code,
            "reasons": self.reasons,
            "checks": [c.to_dict() for c in self.checks],
            "thresholds": self.thresholds.to_dict(),
            **self.stats.to_dict(),
        }


def _level(
    name: str, value: float, warn: float | None, error: float | None, *, below: bool, unit: str, what: str
) -> HealthCheck:
    """One alerting rule: ``value`` against its error, then its warning threshold (over them, or
    under them with ``below``)."""

    def crosses(limit: float | None) -> bool:
        return limit is not None and (value < limit if below else value > limit)

    word = "under" if below else "over"
    levels = [
        f"{label} {word} {limit:g}{unit}" for label, limit in (("warn", warn), ("error", error)) if limit is not None
    ]
    rule = f"{what}: " + (", ".join(levels) if levels else "no threshold set")
    if crosses(error):
        return HealthCheck(name, value, Verdict.ERROR, rule)
    if crosses(warn):
        return HealthCheck(name, value, Verdict.WARNING, rule)
    return HealthCheck(name, value, Verdict.OK, rule)


def _alerts(s: Stats, th: Thresholds, act: Activity) -> list[HealthCheck]:
    window = f"over the last {th.window:g}s"
    checks = [
        _level(
            "oldest_pending_age",
            round(s.oldest_pending_age or 0.0, 3),
            th.pending_age_warn,
            th.pending_age_error,
            below=False,
            unit="s",
            what="seconds the oldest pending job has waited",
        )
    ]
    rate = act.success_rate
    if rate is None:
        checks.append(HealthCheck("success_rate", 1.0, Verdict.OK, f"no job finished {window}"))
    else:
        checks.append(
            _level(
                "success_rate",
                round(rate, 4),
                th.success_rate_warn,
                th.success_rate_error,
                below=True,
                unit="",
                what=f"completed / finished {window} ({act.completed} completed, {act.failed} failed)",
            )
        )
    for job_type, p95 in sorted(act.p95_by_type.items()):
        checks.append(
            _level(
                f"p95_duration:{job_type}",
                p95,
                th.p95_warn,
                th.p95_error,
                below=False,
                unit="s",
                what=f"p95 run time of {job_type} jobs completed {window}",
            )
        )
    return checks


def assess(s: Stats, thresholds: Thresholds | None = None, act: Activity | None = None) -> Health:
    """The verdict for ``s``: the worst of the backlog, stuck and failed checks, and, given the
    window's ``act``, the alerting rules (oldest pending age, success rate, p95 per type)."""
    th = thresholds or Thresholds()
    if s.outstanding >= th.backlog_limit:
        backlog = HealthCheck(
            "backlog", s.outstanding, Verdict.ERROR, f"at or over the soft limit of {th.backlog_limit}"
        )
    elif s.outstanding >= th.backlog_warn:
        backlog = HealthCheck(
            "backlog",
            s.outstanding,
            Verdict.WARNING,
            f"at or over {th.warn_ratio:.0%} of the soft limit of {th.backlog_limit}",
        )
    else:
        backlog = HealthCheck(
            "backlog", s.outstanding, Verdict.OK, f"under {th.backlog_warn} (warn) / {th.backlog_limit} (error)"
        )
    stuck = HealthCheck(
        "stuck",
        s.stuck,
        Verdict.ERROR if s.stuck else Verdict.OK,
        f"claimed with a lock older than {s.lock_timeout:g}s; any stuck job is an error",
    )
    failed = HealthCheck(
        "failed",
        s.failed,
        Verdict.WARNING if s.failed else Verdict.OK,
        "any failed job is a warning (tether retry --failed, or purge them)",
    )
    checks = [backlog, stuck, failed]
    for b in s.by_type:
        # A worker claims only the types it has: jobs of a type no running worker has wait. A
        # paused type's jobs wait because an operator said so: no warning.
        waited = (s.now - b.oldest_ready_at).total_seconds() if b.oldest_ready_at else 0.0
        if b.pending and not b.claimed and not b.paused and waited > th.unclaimed_grace:
            checks.append(
                HealthCheck(
                    f"unclaimed:{b.type}",
                    round(waited, 3),
                    Verdict.WARNING,
                    f"a {b.type} job has been ready for over {th.unclaimed_grace:g}s and none is running: "
                    f"is a worker with this type registered (--import)?",
                )
            )
    if act is not None:
        checks += _alerts(s, th, act)
    worst = max((c.verdict for c in checks), key=lambda v: v.exit_code)
    return Health(worst, checks, th, s)
