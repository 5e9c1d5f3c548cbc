"""The AWS resources the ledger manages: each ``aws:`` target's latest job and what it left.

A ``sync_aws`` job's target is ``aws:<resource type>:<region>:<resource id>``; its result says the
state it made (present or absent), whether it changed anything, and the resource's identity (ARN,
URL). What the world holds now is reconcile's question (its findings name the same targets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..errors import ConfigError
from ..jobtypes.target import AWS, Target
from ..ledger.record import JobRecord
from ..ledger.schema import jobs as jobs_table
from .readonly import Source, reading, records, select_jobs

_LOW = f"{AWS}:"  # every aws: key sorts at or after this and before _HIGH (';' follows ':')
_HIGH = f"{AWS};"
_OUTCOME = ("state", "changed", "created", "fields")  # the rest of a result is the identity


@dataclass(frozen=True)
class Resource:
    """One AWS resource and its latest job (completed, failed, or still to run)."""

    target: str
    resource_type: str
    region: str
    resource_id: str
    job: JobRecord

    @property
    def state(self) -> str | None:
        """``present`` or ``absent`` as the latest completed job left it; None until one has."""
        value = self._result.get("state")
        return str(value) if value is not None else None

    @property
    def changed(self) -> bool | None:
        value = self._result.get("changed")
        return bool(value) if value is not None else None

    @property
    def identity(self) -> dict[str, Any]:
        """What AWS calls it (ARN, URL, version id), as the latest completed job read it back."""
        return {k: v for k, v in self._result.items() if k not in _OUTCOME}

    @property
    def _result(self) -> dict[str, Any]:
        data = self.job.result_data
        return data if isinstance(data, dict) else {}

    @classmethod
    def of(cls, job: JobRecord) -> Resource:
        identity = Target.parse(job.ordering_key or "").identity
        resource_type, _, rest = identity.partition(":")
        region, _, resource_id = rest.partition(":")
        return cls(job.ordering_key or "", resource_type, region, resource_id, job)


@dataclass(frozen=True)
class ResourcePage:
    """One page of resources in target order; ``after`` is the next page's cursor (None: last)."""

    resources: list[Resource]
    after: str | None


def aws_resources(source: Source, *, after: str | None = None, limit: int = 100) -> ResourcePage:
    """The AWS resources jobs have targeted, each with its latest job, in target order, a page
    at a time (keyset: ``after`` is the last target of the previous page). Each target's newest
    job id comes from ``ix_tether_jobs_on_target`` alone (the ``aws:`` range of it, grouped in its
    own order); only the page's jobs are read from the table."""
    if limit < 1:
        raise ConfigError(f"a page holds at least one resource, not {limit}")
    low = jobs_table.c.ordering_key > after if after is not None else jobs_table.c.ordering_key >= _LOW
    newest = (
        sa.select(sa.func.max(jobs_table.c.id))
        .where(jobs_table.c.ordering_key.is_not(None), low, jobs_table.c.ordering_key < _HIGH)
        .group_by(jobs_table.c.ordering_key)
        .order_by(jobs_table.c.ordering_key)
        .limit(limit + 1)
    )
    with reading(source) as conn:
        jobs = records(conn, select_jobs().where(jobs_table.c.id.in_(newest)).order_by(jobs_table.c.ordering_key))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return ResourcePage([Resource.of(j) for j in jobs], jobs[-1].ordering_key if more else None)
