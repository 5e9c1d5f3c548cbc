"""What jobs paid, as their results record it: which results are billed and how their numbers are
read, in one place for ``tether durations`` (``observe.spend``) and the metrics' spend families.

A billed result is a JSON object recording ``cost_usd`` (an AI extraction's ``total_cost_usd``),
with ``input_tokens``, ``output_tokens`` and ``model``. Each is parsed once per job read, and only
after a LIKE that is cheap on every other row; a value that is not a JSON number counts as none
(a cast would fail the whole reading on PostgreSQL).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSON

from .readonly import t

SPENT_KEYS = ("cost_usd", "input_tokens", "output_tokens")
"""The numbers a billed result records, in the order every reading returns them."""
_PATHS = tuple(f"$.{key}" for key in (*SPENT_KEYS, "model"))


def billed() -> Any:
    """Jobs whose result is an object recording ``cost_usd``."""
    return t.c.result.like('{%"cost_usd"%')


def sqlite_spent() -> Any:
    """SQLite: ``[cost, tokens in, tokens out, model]`` of a result as one JSON array (one parse
    of the result; ``spent_of`` reads it)."""
    return sa.func.json_extract(t.c.result, *_PATHS)


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
        sa.func.json_to_record(sa.cast(t.c.result, JSON))
        .table_valued(*(sa.column(key, JSON) for key in SPENT_KEYS), sa.column("model", sa.Text))
        .render_derived("spent", with_types=True)
    )


def pg_number(value: Any) -> Any:
    """PostgreSQL: a json value as double precision when it is a number, else NULL."""
    return sa.case((sa.func.json_typeof(value) == "number", sa.cast(sa.cast(value, sa.Text), sa.Float)), else_=None)
