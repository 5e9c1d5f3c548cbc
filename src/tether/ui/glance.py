"""The overview at a glance: counters by state, each a link to its jobs, and the checks table
with one row per rule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..cli.output import age, seconds
from ..observe.backlog import Stats
from ..observe.verdict import HealthCheck, Verdict
from ..reconcile.runs import Verdict as DriftVerdict

# The counters, in the order a job moves through them: (state, its count, the jobs it links to).
# A new state is one line here.
COUNTERS: tuple[tuple[str, Callable[[Stats], int], str], ...] = (
    ("ready", lambda s: s.ready, "/jobs?status=ready"),
    ("scheduled", lambda s: s.scheduled, "/jobs?status=scheduled"),
    ("retrying", lambda s: s.retrying, "/jobs?status=retrying"),
    ("running", lambda s: s.running, "/jobs?status=running"),
    ("stuck", lambda s: s.stuck, "/jobs?status=stuck"),
    ("failed", lambda s: s.failed, "/jobs?status=failed"),
)
ALARMING = {"stuck": "error", "failed": "warning"}
"""The counters shown in a verdict's colour while they are not zero."""


@dataclass(frozen=True)
class Counter:
    state: str
    count: int
    href: str
    tone: str
    """The badge class: ``ok``, or ``warning``/``error`` for a counter that alarms."""


def counters(s: Stats, drift: DriftVerdict | None) -> list[Counter]:
    """One counter per state, and the drift of the last reconcile check (none yet: ``-1``)."""
    out = []
    for state, count_of, href in COUNTERS:
        n = count_of(s)
        out.append(Counter(state, n, href, ALARMING.get(state, "ok") if n else "ok"))
    drifted = -1 if drift is None else drift.drift
    out.append(Counter("drift", drifted, "/drift", "error" if drifted > 0 else "ok"))
    return out


@dataclass(frozen=True)
class CheckRow:
    name: str
    value: str
    verdict: Verdict
    what: str
    threshold: str


def check_rows(checks: list[HealthCheck]) -> list[CheckRow]:
    """One row per rule: the p95 run times of every type fold into one row naming the slowest,
    unless one is past its threshold, which is then shown on a row of its own."""
    rows: list[CheckRow] = []
    within = [c for c in checks if c.name.startswith("p95_duration:") and c.verdict is Verdict.OK]
    for c in checks:
        if c in within:
            if c is max(within, key=lambda w: w.value):
                others = f" (slowest of {len(within)} types)" if len(within) > 1 else ""
                rows.append(_row(c, "p95_duration", f"{c.name.split(':', 1)[1]}{others}"))
            continue
        rows.append(_row(c, c.name, ""))
    return rows


def _row(c: HealthCheck, name: str, note: str) -> CheckRow:
    what, _, threshold = c.rule.partition(": ")
    return CheckRow(name, _value(c) + (f" · {note}" if note else ""), c.verdict, what, threshold or c.rule)


def _value(c: HealthCheck) -> str:
    """A check's value as its unit reads: a rate in percent, a time in seconds, a count whole."""
    if c.name == "success_rate":
        return f"{c.value:.1%}"
    if c.name.startswith("p95_duration"):
        return seconds(c.value)
    if c.name.startswith(("oldest_pending_age", "unclaimed")):
        return age(c.value)
    return f"{c.value:g}"
