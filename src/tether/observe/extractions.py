"""AI extractions over a window: what they cost (by type and model) and how their attempts ended.

An extraction's result records the assistant's bill (``cost_usd``, tokens, model); one completed
from an answer already on disk records none. A failed attempt's ``last_error`` starts with its
verdict (``verdict=rate_limited; exit=1; ...``, see ``jobtypes/assistant.py``): the failed jobs of
the window are counted by it, and so are the jobs still waiting to retry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from ..ledger.schema import ACTIVE_KEYED_SQL
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from . import billing
from .finished import error_summary
from .readonly import Source, done, now_of, reading

TYPES = ("claude_extraction",)
_VERDICT = re.compile(r"^verdict=([A-Za-z_]+)")


@dataclass(frozen=True)
class ModelSpend:
    """Completed jobs of one type answered by one model, and what they cost (USD, tokens)."""

    type: str
    model: str | None
    jobs: int
    cost_usd: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class VerdictCount:
    """How many jobs ended (``failed``, in the window) or wait to retry (``waiting``, now) on a verdict."""

    verdict: str
    failed: int = 0
    waiting: int = 0


@dataclass(frozen=True)
class Extractions:
    since: datetime
    types: tuple[str, ...]
    spend: list[ModelSpend]
    unbilled: int
    """Completed in the window without an assistant's bill: an answer already on disk was landed."""
    verdicts: list[VerdictCount]

    @property
    def cost_usd(self) -> float:
        return round(sum(s.cost_usd for s in self.spend), 6)

    @property
    def billed(self) -> int:
        return sum(s.jobs for s in self.spend)


def verdict_of(last_error: str | None) -> str:
    """An attempt's verdict (``rate_limited``), else the error's own summary line."""
    found = _VERDICT.match(last_error or "")
    return found.group(1) if found else error_summary(last_error)


def extractions(
    source: Source,
    *,
    since: datetime | timedelta = timedelta(hours=24),
    types: Sequence[str] = TYPES,
    now: datetime | None = None,
) -> Extractions:
    """Spend by type and model of the jobs of ``types`` completed since ``since``; verdicts of
    those that failed since then, and of those waiting to retry. Reads the window's finished
    jobs through ``ix_tether_jobs_done`` and the waiting ones through the active-key index
    (extractions are keyed), never the whole table."""
    if isinstance(since, timedelta):
        since = now_of(source, now) - since
    names = tuple(types)
    with reading(source) as conn:
        window = (
            jobs_table.c.status == JobStatus.COMPLETED.value,
            jobs_table.c.completed_at >= since,
            jobs_table.c.type.in_(names),
        )
        bills = billing.bills(conn, *window)
        completed = conn.execute(sa.select(sa.func.count()).where(*window)).scalar_one()
        failed = conn.execute(
            sa.select(jobs_table.c.last_error).where(
                jobs_table.c.status == JobStatus.FAILED.value,
                done(),
                jobs_table.c.completed_at >= since,
                jobs_table.c.type.in_(names),
            )
        ).scalars()
        by_verdict: dict[str, dict[str, int]] = {}
        for error in failed:
            counts = by_verdict.setdefault(verdict_of(error), {"failed": 0, "waiting": 0})
            counts["failed"] += 1
        # Extractions are keyed: their active jobs are the active-key index's range for their types.
        waiting = conn.execute(
            sa.select(jobs_table.c.last_error).where(
                jobs_table.c.type.in_(names), sa.text(ACTIVE_KEYED_SQL), jobs_table.c.last_error.is_not(None)
            )
        ).scalars()
        for error in waiting:
            counts = by_verdict.setdefault(verdict_of(error), {"failed": 0, "waiting": 0})
            counts["waiting"] += 1
    spend = [
        ModelSpend(name, model, b.jobs, round(b.cost_usd, 6), b.input_tokens, b.output_tokens)
        for (name, model), b in bills.items()
    ]
    spend.sort(key=lambda s: (-s.cost_usd, s.type, s.model or ""))
    unbilled = completed - sum(s.jobs for s in spend)
    verdicts = [VerdictCount(v, c["failed"], c["waiting"]) for v, c in by_verdict.items()]
    verdicts.sort(key=lambda v: (-(v.failed + v.waiting), v.verdict))
    return Extractions(since, names, spend, unbilled, verdicts)
