"""The health verdict of a ledger: ok / warning / error, with the thresholds that decided it.

Exit codes follow the monitoring-plugin (Nagios) convention so ``tether status`` can be used as
any health check: 0 ok, 1 warning, 2 error, 3 could not tell. The backlog limit is *soft*: jobs
are never refused because of it, it only changes the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from . import config
from .errors import ConfigError
from .observe import Source, Stats, stats


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
    at 100%; any stuck job is an error; any failed job is a warning."""

    backlog_limit: int = config.DEFAULT_BACKLOG_LIMIT
    warn_ratio: float = 0.8

    def __post_init__(self) -> None:
        if self.backlog_limit < 1:
            raise ConfigError(f"backlog limit must be at least 1, not {self.backlog_limit}")
        if not 0 < self.warn_ratio <= 1:
            raise ConfigError(f"backlog warning ratio must be in (0, 1], not {self.warn_ratio}")

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
        }


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


def assess(s: Stats, thresholds: Thresholds | None = None) -> Health:
    """The verdict for ``s``: the worst of the backlog, stuck and failed checks."""
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
    worst = max((c.verdict for c in checks), key=lambda v: v.exit_code)
    return Health(worst, checks, th, s)


def health(source: Source, thresholds: Thresholds | None = None, **kwargs: Any) -> Health:
    """``assess(stats(source, **kwargs), thresholds)``: the Python form of ``tether status``."""
    return assess(stats(source, **kwargs), thresholds)
