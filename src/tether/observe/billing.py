"""What jobs paid, as their results record it: which results are billed and how their numbers are
read, in one place for ``tether durations`` (``spend``), the extractions view
(``extractions``) and the metrics' spend families.

A billed result is a JSON object recording ``cost_usd`` (an AI extraction's ``total_cost_usd``),
with ``input_tokens``, ``output_tokens`` and ``model``. Each is parsed once per job read, and only
after a LIKE that is cheap on every other row; a value that is not a JSON number counts as none
(a cast would fail the whole reading on PostgreSQL).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSON

from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .readonly import Source, reading

SPENT_KEYS = ("cost_usd", "input_tokens", "output_tokens")
"""The numbers a billed result records, in the order every reading returns them."""
_PATHS = tuple(f"$.{key}" for key in (*SPENT_KEYS, "model"))


def billed() -> Any:
    """Jobs whose result is an object recording ``cost_usd``."""
    return jobs_table.c.result.like('{%"cost_usd"%')


def sqlite_spent() -> Any:
    """SQLite: ``[cost, tokens in, tokens out, model]`` of a result as one JSON array (one parse
    of the result; ``spent_of`` reads it)."""
    return sa.func.json_extract(jobs_table.c.result, *_PATHS)


def sqlite_number(key: str) -> Any:
    """SQLite: the result's ``key`` when it is a JSON number, else NULL."""
    path = f"$.{key}"
    kind = sa.func.json_type(jobs_table.c.result, path)
    return sa.case((kind.in_(("integer", "real")), sa.func.json_extract(jobs_table.c.result, path)), else_=None)


def spent_of(values: list[Any]) -> tuple[float | None, float | None, float | None, Any]:
    """What ``sqlite_spent`` read: the three numbers (None where not a number) and the model."""
    cost, tokens_in, tokens_out, model = values
    return number(cost), number(tokens_in), number(tokens_out), model


def number(value: Any) -> float | None:
    """A JSON number, else None: a string or a boolean where a cost should be is not summed."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def pg_record() -> Any:
    """PostgreSQL: a result parsed once (``json_to_record``), as a FROM item ``spent`` with the
    SPENT_KEYS as json values (read them with ``pg_number``) and ``model`` as text."""
    return (
        sa.func.json_to_record(sa.cast(jobs_table.c.result, JSON))
        .table_valued(*(sa.column(key, JSON) for key in SPENT_KEYS), sa.column("model", sa.Text))
        .render_derived("spent", with_types=True)
    )


def pg_number(value: Any) -> Any:
    """PostgreSQL: a json value as double precision when it is a number, else NULL."""
    return sa.case((sa.func.json_typeof(value) == "number", sa.cast(sa.cast(value, sa.Text), sa.Float)), else_=None)


@dataclass
class Bill:
    """What the billed jobs of one (type, model) paid."""

    jobs: int = 0
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0


def bills(conn: sa.Connection, *where: Any) -> dict[tuple[str, str | None], Bill]:
    """Per (type, model) (None: the result names none), the billed jobs among those ``where``
    selects and what their results record; each result parsed once."""
    out: dict[tuple[str, str | None], Bill] = {}
    if conn.dialect.name == "postgresql":
        record = pg_record()
        sums = (sa.func.coalesce(sa.func.sum(pg_number(record.c[k])), 0) for k in SPENT_KEYS)
        query = sa.select(jobs_table.c.type, record.c.model, sa.func.count(), *sums).select_from(
            jobs_table.join(record, sa.true())
        )
        for name, model, n, cost, tokens_in, tokens_out in conn.execute(
            query.where(*where, billed()).group_by(jobs_table.c.type, record.c.model)
        ):
            out[(name, model)] = Bill(n, float(cost), int(tokens_in), int(tokens_out))
        return out
    # SQLite sums in the statement: its JSON functions reuse a result's parse within a row, and
    # handing each row to Python cost more than the reading itself.
    model = sa.func.json_extract(jobs_table.c.result, "$.model")
    totals = (sa.func.total(sqlite_number(key)) for key in SPENT_KEYS)
    query = sa.select(jobs_table.c.type, model, sa.func.count(), *totals).where(*where, billed())
    for name, found, n, cost, tokens_in, tokens_out in conn.execute(query.group_by(jobs_table.c.type, model)):
        key = (name, None if found is None else str(found))
        bill = out.setdefault(key, Bill())  # a number and a string model may name one key
        bill.jobs += n
        bill.cost_usd += cost
        bill.input_tokens += int(tokens_in)
        bill.output_tokens += int(tokens_out)
    return out


@dataclass(frozen=True)
class Spend:
    """Summed over a type's completed jobs whose result records ``cost_usd`` (an AI assistant's
    envelope): US dollars and tokens."""

    jobs: int
    cost_usd: float
    input_tokens: int
    output_tokens: int


def spend(source: Source, *, since: datetime, job_type: str | None = None) -> dict[str, Spend]:
    """Per type, the cost and tokens of jobs completed since ``since`` (see Spend; ``bills``
    says which results count and how they are read)."""
    window = [jobs_table.c.status == JobStatus.COMPLETED.value, jobs_table.c.completed_at >= since]
    if job_type is not None:
        window.append(jobs_table.c.type == job_type)
    with reading(source) as conn:
        by_model = bills(conn, *window)
    totals: dict[str, Bill] = {}
    for (name, _), bill in by_model.items():
        total = totals.setdefault(name, Bill())
        total.jobs += bill.jobs
        total.cost_usd += bill.cost_usd
        total.input_tokens += bill.input_tokens
        total.output_tokens += bill.output_tokens
    return {name: Spend(b.jobs, round(b.cost_usd, 6), b.input_tokens, b.output_tokens) for name, b in totals.items()}
