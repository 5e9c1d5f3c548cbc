"""The ledger's tables as SQLModel classes: typed rows for an application that reads them through
its own ``Session`` (``session.exec(select(Job).where(...))``).

Each class is mapped onto the Core table of ``tether.ledger.schema`` (its ``__table__``), each field onto
that table's own column object, so the columns, types and indexes are defined once, there: a
field whose column does not exist fails at import. tether itself reads and writes through the
Core tables; only this module loads SQLModel and pydantic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

from . import schema

_jobs, _meta, _schedules, _runs = schema.jobs.c, schema.meta.c, schema.schedules.c, schema.reconcile_runs.c
_attempts = schema.attempts.c


def _field(column: sa.Column[Any]) -> Any:
    """The field of ``column``, with the column's own default (None for a nullable column
    without one; required otherwise)."""
    if column.default is not None:
        return Field(default=column.default.arg, sa_column=column)  # type: ignore[attr-defined]  # a scalar default
    if column.nullable:
        return Field(default=None, sa_column=column)
    return Field(sa_column=column)


class TetherModel(SQLModel, registry=registry(metadata=schema.metadata)):
    """Own registry, so an application's ``SQLModel.metadata.create_all`` never touches ours."""


class Job(TetherModel, table=True):
    """One unit of intended work and where it stands (``tether_jobs``)."""

    __table__ = schema.jobs

    id: str = _field(_jobs.id)
    type: str = _field(_jobs.type)
    payload: str = _field(_jobs.payload)
    status: str = _field(_jobs.status)
    priority: int = _field(_jobs.priority)
    attempts: int = _field(_jobs.attempts)
    max_attempts: int = _field(_jobs.max_attempts)
    last_error: str | None = _field(_jobs.last_error)
    locked_by: str | None = _field(_jobs.locked_by)
    locked_at: datetime | None = _field(_jobs.locked_at)
    created_at: datetime = _field(_jobs.created_at)
    claimed_at: datetime | None = _field(_jobs.claimed_at)
    completed_at: datetime | None = _field(_jobs.completed_at)
    run_at: datetime = _field(_jobs.run_at)
    idempotency_key: str | None = _field(_jobs.idempotency_key)
    ordering_key: str | None = _field(_jobs.ordering_key)
    parent_id: str | None = _field(_jobs.parent_id)
    result: str | None = _field(_jobs.result)
    timeout: float | None = _field(_jobs.timeout)
    progress: str | None = _field(_jobs.progress)
    quarantine: str | None = _field(_jobs.quarantine)
    payload_bytes: int | None = _field(_jobs.payload_bytes)
    blocked: bool = _field(_jobs.blocked)  # an older job on its target is active (statements/sqlite.sql)
    snoozes: int = _field(_jobs.snoozes)  # times it snoozed, its attempt given back
    meta: str | None = _field(_jobs.meta)  # the caller's JSON object, shown with the job (ledger/notes.py)
    retry_of: str | None = _field(_jobs.retry_of)  # the failed job this one retries with a corrected payload
    cancel_reason: str | None = _field(_jobs.cancel_reason)  # an operator's cancel of the running job
    fingerprint: str | None = _field(_jobs.fingerprint)  # its file as a stat saw it (datafiles/fingerprint.py)
    traceparent: str | None = _field(_jobs.traceparent)  # the W3C trace context of its enqueue


class JobTag(TetherModel, table=True):
    """One tag of one job (``tether_job_tags``, see ledger/notes.py)."""

    __table__ = schema.job_tags

    tag: str = _field(schema.job_tags.c.tag)
    job_id: str = _field(schema.job_tags.c.job_id)


class Meta(TetherModel, table=True):
    """What a ledger knows about itself (``tether_meta``, see meta.py)."""

    __table__ = schema.meta

    key: str = _field(_meta.key)
    value: str = _field(_meta.value)


class Schedule(TetherModel, table=True):
    """One periodic job's coordination state (``tether_schedules``, see worker/schedule.py)."""

    __table__ = schema.schedules

    name: str = _field(_schedules.name)
    cron: str = _field(_schedules.cron)
    timezone: str = _field(_schedules.timezone)
    job_type: str = _field(_schedules.job_type)
    start_at: datetime | None = _field(_schedules.start_at)
    end_at: datetime | None = _field(_schedules.end_at)
    run_limit: int | None = _field(_schedules.run_limit)
    catch_up: str = _field(_schedules.catch_up)
    last_slot: datetime | None = _field(_schedules.last_slot)
    last_job_id: str | None = _field(_schedules.last_job_id)
    next_slot: datetime | None = _field(_schedules.next_slot)
    paused: bool = _field(_schedules.paused)
    run_count: int = _field(_schedules.run_count)
    missed: int = _field(_schedules.missed)
    updated_at: datetime = _field(_schedules.updated_at)


class ReconcileRun(TetherModel, table=True):
    """The verdict of one reconcile check (``tether_reconcile_runs``, see reconcile/runs.py)."""

    __table__ = schema.reconcile_runs

    id: str = _field(_runs.id)
    checked_at: datetime = _field(_runs.checked_at)
    finished_at: datetime = _field(_runs.finished_at)
    mode: str = _field(_runs.mode)
    exit_code: int = _field(_runs.exit_code)
    drift: int = _field(_runs.drift)
    counts: str = _field(_runs.counts)


class Attempt(TetherModel, table=True):
    """How one attempt that did not complete its job ended (``tether_attempts``, see attempts.py)."""

    __table__ = schema.attempts

    id: int = _field(_attempts.id)
    job_id: str = _field(_attempts.job_id)
    attempt: int = _field(_attempts.attempt)
    started_at: datetime = _field(_attempts.started_at)
    ended_at: datetime = _field(_attempts.ended_at)
    worker: str | None = _field(_attempts.worker)
    outcome: str = _field(_attempts.outcome)
    error: str | None = _field(_attempts.error)
    traceparent: str | None = _field(_attempts.traceparent)  # the attempt's span (tether.tracing)
