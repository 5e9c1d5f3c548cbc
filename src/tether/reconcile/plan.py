"""A repair plan: per finding of a check, the job that would bring the world back to what the
ledger says was done, or why there is none. Making a plan changes nothing; ``repair.apply``
enqueues its jobs once an operator approved them.

What restores each finding: a missing or modified target (a file, an AWS resource), or one the
ledger says is absent but exists, gets the target's latest completed job again (same type, same
payload but for what ``JobType.repair`` changes: a ``create_file`` overwrites; linked to it as
its repair); a leftover temp file gets its removal. An untracked file
and a target that could not be read get no job: the ledger holds nothing to restore them to.
The plan records the ledger's newest job id and each target's newest job id, so an apply can
refuse a plan that another job on one of its targets made stale.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
import sqlalchemy as sa

from ..errors import ConfigError
from ..jobtypes.remove_temp import data_file_of
from ..jobtypes.target import file_key
from ..ledger.engine import READ_ONLY
from ..ledger.schema import jobs
from ..ledger.status import JobStatus
from .drift import LEFTOVER_TEMP, MISSING, MODIFIED, UNEXPECTED, UNKNOWN, UNTRACKED, Finding, Report

if TYPE_CHECKING:
    from ..coordinator import Coordinator
    from ..jobtypes import Registry

FORMAT = 1
"""The plan file's format, written into it: a plan from another format is refused."""

RESTORABLE = frozenset({MISSING, MODIFIED, UNEXPECTED})
REMOVE_TEMP = "remove_temp"
UNTRACKED_REASON = "no job ever named it: the ledger holds no state to restore (remove it by hand, or enqueue a job)"
NOT_A_TEMP_REASON = "its name is not one tether's writes give their temp files: remove it by hand"
_ENDED_UNDONE = (JobStatus.FAILED.value, JobStatus.CANCELLED.value)
MOVED_REASON = "a job on it came after the check: check again"
ADOPTED_REASON = "its expected state was accepted (drift accept): the ledger holds no content to restore"


@dataclass(frozen=True)
class Step:
    """One finding and what the plan does about it. ``job_type`` None: no job (``reason`` says
    why). ``latest_job_id``: the target's newest job to run or completed when the plan was made."""

    target: str
    path: str
    finding: str
    job_type: str | None = None
    payload: dict[str, Any] | None = None
    repair_of: str | None = None
    latest_job_id: str | None = None
    reason: str | None = None


@dataclass
class Plan:
    """What ``plan_repairs`` proposes, as the file ``tether reconcile --plan --out`` writes."""

    made_at: datetime
    ledger_id: str
    newest_job_id: str | None
    steps: list[Step] = field(default_factory=list)

    @property
    def jobs(self) -> list[Step]:
        """The steps that enqueue a job."""
        return [s for s in self.steps if s.job_type is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "made_at": self.made_at.isoformat(),
            "ledger_id": self.ledger_id,
            "newest_job_id": self.newest_job_id,
            "steps": [asdict(s) for s in self.steps],
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, text: bytes | str, source: str = "the plan") -> Plan:
        """A plan read back; a ConfigError naming ``source`` if it is not one."""
        try:
            data = orjson.loads(text)
            if data.get("format") != FORMAT:
                raise ConfigError(f"{source}: format {data.get('format')!r} is not a plan of format {FORMAT}")
            steps = [Step(**s) for s in data["steps"]]
            made_at = datetime.fromisoformat(data["made_at"])
            return cls(made_at, data["ledger_id"], data["newest_job_id"], steps)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(f"{source} is not a repair plan written by `tether reconcile --plan`: {e}") from e


def plan_repairs(coordinator: Coordinator, report: Report | None = None, **options: Any) -> Plan:
    """The plan for ``report``'s findings (a new check with ``options`` if none is given)."""
    if report is None:
        from .check import reconcile

        report = reconcile(coordinator, **options)
    wanted = [f for f in report.findings if f.status in RESTORABLE | {LEFTOVER_TEMP, UNTRACKED, UNKNOWN}]
    with coordinator.engine.connect().execution_options(**READ_ONLY) as conn:
        deciding = _jobs(conn, [f.job_id for f in wanted if f.job_id and f.status in RESTORABLE])
        steps = [_step(f, deciding, coordinator.registry) for f in wanted]
        latest = latest_jobs(conn, sorted({s.target for s in steps if s.job_type is not None}))
    steps = [s if s.job_type is None else _with_latest(s, latest.get(s.target)) for s in steps]
    return Plan(coordinator.clock.now(), coordinator.queue.ledger_id, report.newest_job_id, steps)


def _step(finding: Finding, deciding: dict[str, Any], registry: Registry) -> Step:
    if finding.status == LEFTOVER_TEMP:
        if data_file_of(finding.path) is None:
            return Step(file_key(finding.path), finding.path, finding.status, reason=NOT_A_TEMP_REASON)
        return Step(f"temp:{finding.path}", finding.path, finding.status, REMOVE_TEMP, {"path": finding.path})
    job = deciding.get(finding.job_id or "")
    if finding.status == UNTRACKED:
        return Step(file_key(finding.path), finding.path, finding.status, reason=UNTRACKED_REASON)
    if finding.status == UNKNOWN or job is None:
        why = finding.detail or "the target could not be read"
        if finding.status != UNKNOWN:
            why = "its latest completed job is gone from the ledger (purged?)"
        return Step(file_key(finding.path), finding.path, finding.status, reason=f"not restorable: {why}")
    if job.type == "adopt":
        return Step(job.ordering_key, finding.path, finding.status, reason=ADOPTED_REASON)
    if job.type not in registry.names():
        why = f"job type {job.type!r} is not registered here (pass --import MODULE)"
        return Step(job.ordering_key, finding.path, finding.status, reason=why)
    job_type = registry.get(job.type)
    repair = job_type.repair(job_type.payload_model.model_validate_json(job.payload))
    payload = orjson.loads(repair.to_json())
    return Step(job.ordering_key, finding.path, finding.status, job.type, payload, repair_of=job.id)


def _with_latest(step: Step, latest: str | None) -> Step:
    """``step`` with its target's newest job; no job if one came after the job the check read (a
    report older than the plan: its finding may be that job's effect)."""
    if step.repair_of is not None and latest != step.repair_of:
        return Step(step.target, step.path, step.finding, latest_job_id=latest, reason=MOVED_REASON)
    return Step(**{**asdict(step), "latest_job_id": latest})


def _jobs(conn: sa.Connection, ids: list[str]) -> dict[str, Any]:
    """The deciding jobs of the findings, by id."""
    found: dict[str, Any] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        query = sa.select(jobs.c.id, jobs.c.type, jobs.c.payload, jobs.c.ordering_key).where(jobs.c.id.in_(chunk))
        found.update((row.id, row) for row in conn.execute(query))
    return found


def latest_jobs(conn: sa.Connection, keys: list[str]) -> dict[str, str]:
    """Each target's newest job id that is to run or completed (a target without one is absent).
    A failed or cancelled job after the completed one does not hold a repair back: the repair
    restores what the ledger says was done, whatever such a job left."""
    found: dict[str, str] = {}
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        query = (
            sa.select(jobs.c.ordering_key, sa.func.max(jobs.c.id))
            .where(jobs.c.ordering_key.in_(chunk), jobs.c.status.not_in(_ENDED_UNDONE))
            .group_by(jobs.c.ordering_key)
        )
        found.update((key, newest) for key, newest in conn.execute(query))
    return found
