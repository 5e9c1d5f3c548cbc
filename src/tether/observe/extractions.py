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
from typing import Any

import sqlalchemy as sa

from ..ledger.schema import ACTIVE_KEYED_SQL
from ..status import JobStatus
from .queries import error_summary
from .readonly import Source, finished, now_of, reading, t

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
        dialect = conn.dialect.name
        billed = t.c.result.like('%"cost_usd"%')
        model = sa.case((billed, _result(dialect, "model", number=False)), else_=None)
        spent = conn.execute(
            sa.select(
                t.c.type,
                billed,
                model,
                sa.func.count(),
                *(sa.func.coalesce(sa.func.sum(_result(dialect, k)), 0) for k in _BILL),
            )
            .where(t.c.status == JobStatus.COMPLETED.value, t.c.completed_at >= since, t.c.type.in_(names))
            .group_by(t.c.type, billed, model)
        ).all()
        failed = conn.execute(
            sa.select(t.c.last_error).where(
                t.c.status == JobStatus.FAILED.value, finished(), t.c.completed_at >= since, t.c.type.in_(names)
            )
        ).scalars()
        by_verdict: dict[str, dict[str, int]] = {}
        for error in failed:
            counts = by_verdict.setdefault(verdict_of(error), {"failed": 0, "waiting": 0})
            counts["failed"] += 1
        # Extractions are keyed: their active jobs are the active-key index's range for their types.
        waiting = conn.execute(
            sa.select(t.c.last_error).where(t.c.type.in_(names), sa.text(ACTIVE_KEYED_SQL), t.c.last_error.is_not(None))
        ).scalars()
        for error in waiting:
            counts = by_verdict.setdefault(verdict_of(error), {"failed": 0, "waiting": 0})
            counts["waiting"] += 1
    spend = [
        ModelSpend(name, None if m is None else str(m), n, round(float(cost), 6), int(tin), int(tout))
        for name, was_billed, m, n, cost, tin, tout in spent
        if was_billed
    ]
    spend.sort(key=lambda s: (-s.cost_usd, s.type, s.model or ""))
    unbilled = sum(n for _, was_billed, _, n, *_ in spent if not was_billed)
    verdicts = [VerdictCount(v, c["failed"], c["waiting"]) for v, c in by_verdict.items()]
    verdicts.sort(key=lambda v: (-(v.failed + v.waiting), v.verdict))
    return Extractions(since, names, spend, unbilled, verdicts)


_BILL = ("cost_usd", "input_tokens", "output_tokens")


def _result(dialect: str, key: str, *, number: bool = True) -> Any:
    """A value of a job's JSON result (the rows asked about name it: see ``billed``)."""
    if dialect == "sqlite":
        return sa.func.json_extract(t.c.result, f"$.{key}")
    text = sa.func.json_extract_path_text(sa.cast(t.c.result, sa.JSON), key)
    return sa.cast(text, sa.Float) if number else text
