"""Tags and notes: the jobs that carry a tag (``tether jobs --tag``, ``failed --tag``, the ui's
filter, and the job ids an operator's action by tag selects), and what a job carries beside its
row: its tags, its meta, the failed job it retries and the jobs that retried it.

A tag's jobs are a range of ``tether_job_tags``' primary key (tag, job_id), read in id order and
joined to the jobs by theirs: no sort, and no other job is read (schema.py says why tags have a
table of their own).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa

from ..ledger import ids
from ..ledger.record import JobRecord
from ..ledger.schema import job_tags
from ..ledger.schema import jobs as jobs_table
from ..ledger.status import JobStatus
from .readonly import Source, reading, records, select_jobs


def _tagged(query: sa.Select[Any], tag: str) -> sa.Select[Any]:
    on = jobs_table.c.id == job_tags.c.job_id
    return query.select_from(job_tags.join(jobs_table, on)).where(job_tags.c.tag == tag)


def tagged_jobs(
    source: Source,
    tag: str,
    *,
    statuses: Sequence[JobStatus | str] = (),
    job_type: str | None = None,
    since: datetime | None = None,
    finished_since: datetime | None = None,
    limit: int | None = 50,
) -> list[JobRecord]:
    """Jobs carrying ``tag`` that match the filters, newest enqueued first (``since``: enqueued
    since; ``finished_since``: completed or failed since)."""
    query = _tagged(select_jobs(), tag)
    if statuses:
        query = query.where(jobs_table.c.status.in_([JobStatus(s).value for s in statuses]))
    if job_type is not None:
        query = query.where(jobs_table.c.type == job_type)
    if since is not None:
        query = query.where(job_tags.c.job_id >= ids.floor_id(since), jobs_table.c.created_at >= since)
    if finished_since is not None:
        query = query.where(jobs_table.c.completed_at >= finished_since)
    with reading(source) as conn:
        return records(conn, query.order_by(job_tags.c.job_id.desc()).limit(limit))


def job_ids_tagged(source: Source, tag: str, *, statuses: Sequence[JobStatus | str] = ()) -> list[str]:
    """The ids of every job carrying ``tag`` (of ``statuses``, if given), oldest first: what an
    operator's action by tag (cancel, retry) acts on."""
    query = _tagged(sa.select(job_tags.c.job_id), tag)
    if statuses:
        query = query.where(jobs_table.c.status.in_([JobStatus(s).value for s in statuses]))
    with reading(source) as conn:
        return [str(job_id) for job_id in conn.execute(query.order_by(job_tags.c.job_id)).scalars()]


def notes(source: Source, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """For each of ``job_ids``: {"tags": [...], "meta": {...} or None, "retry_of": id or None,
    "retried_as": [ids]}: what the read commands show beside the job (never its payload)."""
    if not job_ids:
        return {}
    out: dict[str, dict[str, Any]] = {
        job_id: {"tags": [], "meta": None, "retry_of": None, "retried_as": []} for job_id in job_ids
    }
    wanted = list(out)
    c = jobs_table.c
    with reading(source) as conn:
        for job_id, tag in conn.execute(
            sa.select(job_tags.c.job_id, job_tags.c.tag).where(job_tags.c.job_id.in_(wanted)).order_by(job_tags.c.tag)
        ):
            out[job_id]["tags"].append(tag)
        for job_id, meta, retry_of in conn.execute(sa.select(c.id, c.meta, c.retry_of).where(c.id.in_(wanted))):
            out[job_id]["meta"] = None if meta is None else orjson.loads(meta)
            out[job_id]["retry_of"] = retry_of
        retried = sa.select(c.retry_of, c.id).where(c.retry_of.in_(wanted)).order_by(c.id)
        for failed_id, job_id in conn.execute(retried):
            out[failed_id]["retried_as"].append(job_id)
    return out
