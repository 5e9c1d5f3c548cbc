"""What a reconcile check answers: the statuses, one finding per path not in sync, the report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..jobtypes.base import IN_SYNC, MISSING, MODIFIED, UNEXPECTED, UNKNOWN, Check, Difference

NOT_CHECKED = "not_checked"
LEFTOVER_TEMP = "leftover_temp"
UNTRACKED = "untracked"

STATUSES = (IN_SYNC, MISSING, MODIFIED, UNEXPECTED, LEFTOVER_TEMP, UNTRACKED, NOT_CHECKED, UNKNOWN)
DRIFT = frozenset({MISSING, MODIFIED, UNEXPECTED, LEFTOVER_TEMP, UNTRACKED})
"""Statuses that are drift (exit 2). ``not_checked`` is in flight; ``unknown`` could not be read."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One target that is not in sync: what the ledger expected (set by ``job_id``), what is
    there, and the fields that differ. ``path`` names the target as an operator does (a file's
    path). The ``*_size`` / ``*_sha256`` fields repeat a file's facts from ``expected`` and
    ``actual`` (they came first, and the JSON keeps them)."""

    path: str
    status: str
    job_id: str | None = None
    job_type: str | None = None
    expected_size: int | None = None
    expected_sha256: str | None = None
    actual_size: int | None = None
    actual_sha256: str | None = None
    detail: str | None = None
    expected: Any = None
    actual: Any = None
    differences: tuple[Difference, ...] = ()

    @classmethod
    def of(cls, path: str, check: Check, job_id: str | None, job_type: str | None) -> Finding:
        """The finding for a probe's check of ``path``'s latest job."""
        exp, act = _facts(check.expected), _facts(check.actual)
        return cls(
            path,
            check.status,
            job_id,
            job_type,
            exp.get("size"),
            exp.get("sha256"),
            act.get("size"),
            act.get("sha256"),
            check.detail,
            check.expected,
            check.actual,
            check.differences,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["differences"] = [d.to_dict() for d in self.differences]
        return out


def _facts(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass
class Report:
    """The answer of one check. ``exit_code`` is Terraform's ``-detailed-exitcode``: 0 in sync,
    2 drift found, 1 could not check (here: some path could not be read, and no drift found)."""

    checked_at: datetime
    content: bool
    untracked: bool
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    findings: list[Finding] = field(default_factory=list)
    newest_job_id: str | None = None
    """The newest of the jobs that decided the targets checked (what the check knew of the ledger)."""
    finished_at: datetime | None = None
    ignored: list[tuple[Finding, str]] = field(default_factory=list)
    """Findings an ignore rule matched, each with that rule: listed, never counted as drift."""
    full: bool = False
    """A content check that read every file (``reconcile --full``), fingerprints or not."""

    @property
    def drift(self) -> int:
        return sum(self.counts[s] for s in DRIFT)

    @property
    def exit_code(self) -> int:
        if self.drift:
            return 2
        return 1 if self.counts[UNKNOWN] else 0

    @property
    def checked(self) -> int:
        """Targets and files looked at (every status)."""
        return sum(self.counts.values())

    def summary(self) -> dict[str, Any]:
        return {
            "checked_at": self.checked_at.isoformat(),
            "newest_job_id": self.newest_job_id,
            "mode": "content" if self.content else "exists",
            "drift": self.drift,
            "exit_code": self.exit_code,
            "counts": dict(self.counts),
            "ignored": len(self.ignored),
        }

    def span_attributes(self) -> dict[str, Any]:
        """What a reconcile run's span carries (tether.tracing): its verdict, never a finding."""
        return {
            "tether.reconcile.mode": "content" if self.content else "exists",
            "tether.reconcile.drift": self.drift,
            "tether.reconcile.exit_code": self.exit_code,
            "tether.reconcile.checked": sum(self.counts.values()),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "untracked_checked": self.untracked,
            "findings": [f.to_dict() for f in self.findings],
            "ignored_findings": [{**f.to_dict(), "rule": rule} for f, rule in self.ignored],
        }


__all__ = [
    "DRIFT",
    "Difference",
    "IN_SYNC",
    "LEFTOVER_TEMP",
    "MISSING",
    "MODIFIED",
    "NOT_CHECKED",
    "STATUSES",
    "UNEXPECTED",
    "UNKNOWN",
    "UNTRACKED",
    "Finding",
    "Report",
]
