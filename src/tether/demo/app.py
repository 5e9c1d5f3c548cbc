"""The small sample application the demo drives (``tether --import tether.demo.app`` registers
its job types outside the demo).

It keeps a requirements tracker as JSON files (``sample_data/data``): people, projects, and
requirements (each a ``requirement.json`` plus a companion ``README.md``). Its data-model code
goes through ``JsonStore`` and two job types of its own, showing both ways to keep one logical
operation one job (docs/design.md, "The durability promise"):

- ``save_requirement``: one job, one handler, writes the model and its companion file;
- ``archive_project``: a parent job whose handler enqueues one ``save_requirement`` child per
  requirement; the children commit with the parent's completion, so they exist iff it completed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import orjson
from pydantic import BaseModel, Field

from ..errors import RetryableError
from ..jobtypes import CreateFile, JobType, Payload, Registry, render
from ..jobtypes.base import IN_SYNC, SYNCED, Check, Probe
from ..jobtypes.context import JobContext
from ..jobtypes.datafiles import durable, paths
from ..jobtypes.datafiles.content import check_file
from ..jobtypes.datafiles.effects import write_locked
from ..jobtypes.datafiles.existence import files_exist
from ..jobtypes.datafiles.paths import checked_path
from ..jobtypes.target import Target

# -- the sample application's models ---------------------------------------------------------


class Person(BaseModel):
    handle: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    name: str = Field(min_length=1)
    email: str = Field(pattern=r"^[^@\s]+@[^@\s]+\.[a-z]+$")
    role: Literal["engineer", "product", "operations", "design"]


class Project(BaseModel):
    slug: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    name: str
    owner: str
    status: Literal["active", "archived"] = "active"


class Requirement(BaseModel):
    id: str = Field(pattern=r"^REQ-\d{3}$")
    project: str
    title: str = Field(min_length=3)
    text: str
    priority: Literal["must", "should", "could"]
    status: Literal["open", "done", "archived"] = "open"
    owner: str
    tags: list[str] = []


def person_path(handle: str) -> str:
    return f"people/{handle}.json"


def project_path(slug: str) -> str:
    return f"projects/{slug}.json"


def requirement_path(req_id: str) -> str:
    return f"requirements/{req_id}/requirement.json"


def report_path(slug: str) -> str:
    return f"reports/{slug}.md"


def json_bytes(model: BaseModel) -> bytes:
    """A model as the sample store keeps it: exactly what ``store.save`` writes."""
    return render(CreateFile(path="x.json", content=model.model_dump(mode="json"), overwrite=True))


def requirement_files(req: Requirement) -> dict[str, bytes]:
    """A requirement and its companion file: both derive from the model alone, so re-running
    the job that writes them is idempotent."""
    tags = ", ".join(req.tags) or "-"
    readme = (
        f"# {req.id}: {req.title}\n\n"
        f"- project: {req.project}\n- priority: {req.priority}\n- status: {req.status}\n"
        f"- owner: @{req.owner}\n- tags: {tags}\n\n{req.text}\n"
    )
    return {requirement_path(req.id): json_bytes(req), f"requirements/{req.id}/README.md": readme.encode()}


def write_file(ctx: JobContext, rel: str, data: bytes) -> bool:
    """The one way the sample handlers write: tether's locked write (lock, no symlink followed,
    skip if unchanged, confirm the lease, atomic write), on the path's canonical name."""
    return write_locked(ctx, paths.canonical(ctx.root, rel), data)


# -- one logical operation, one job ------------------------------------------------------------


class SaveRequirement(Payload):
    """Write a requirement and its companion README.md (one job for both files)."""

    job_type: ClassVar[str] = "save_requirement"
    requirement: Requirement


class RequirementProbe(Probe):
    """The reconciler's check of a save_requirement: both files hold exactly what it wrote."""

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        req = SaveRequirement.model_validate_json(payload).requirement
        for rel, data in requirement_files(req).items():
            found = check_file(root, rel, data) if content else files_exist(root, [rel], present=True)[0]
            if found.status != IN_SYNC:  # name the file: the target is requirement.json alone
                return replace(found, detail=f"{rel}: {found.detail or found.status}")
        return SYNCED


class ExistsProbe(Probe):
    """For effects computed from the disk at run time: only the file's existence is checkable."""

    def __init__(self, model: type[Payload], path: Callable[[Any], str]) -> None:
        self.model, self.path = model, path

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        return files_exist(root, [self.path(self.model.model_validate_json(payload))], present=True)[0]


class SaveRequirementType(JobType[SaveRequirement]):
    name = "save_requirement"
    payload_model = SaveRequirement
    probe = RequirementProbe()

    def prepare(self, payload: SaveRequirement, root: Path) -> SaveRequirement:
        for rel in requirement_files(payload.requirement):
            checked_path(self.name, "requirement.id", root, rel)
        return payload

    def target(self, payload: SaveRequirement) -> Target:
        # Shared with create_file/delete_file jobs on the model file: all apply in enqueue order.
        return Target.file(requirement_path(payload.requirement.id))

    def run(self, payload: SaveRequirement, ctx: JobContext) -> dict[str, Any]:
        files = requirement_files(payload.requirement)
        written = sum(write_file(ctx, rel, data) for rel, data in files.items())
        return {"files": len(files), "written": written}


class ArchiveProject(Payload):
    """Mark a project archived, then archive each of its requirements as a child job."""

    job_type: ClassVar[str] = "archive_project"
    slug: str = Field(pattern=r"^[a-z][a-z0-9-]*$")


class ArchiveProjectType(JobType[ArchiveProject]):
    name = "archive_project"
    payload_model = ArchiveProject
    probe = ExistsProbe(ArchiveProject, lambda p: project_path(p.slug))

    def target(self, payload: ArchiveProject) -> Target:
        return Target.file(project_path(payload.slug))

    def run(self, payload: ArchiveProject, ctx: JobContext) -> dict[str, Any]:
        project = Project.model_validate(
            orjson.loads(durable.read(ctx.root, paths.canonical(ctx.root, project_path(payload.slug))))
        )
        write_file(ctx, project_path(project.slug), json_bytes(project.model_copy(update={"status": "archived"})))
        children = 0
        # Reads the requirements as they are on disk now. A save of one of them still queued
        # (another target, so not ordered before this job) would be overwritten by the archived
        # copy of its old content: archive after such saves completed (the demo has none queued).
        for req in sorted(requirements_on_disk(ctx.root), key=lambda r: r.id):
            if req.project == project.slug and req.status != "archived":
                # Committed in the transaction that completes this job, not before.
                ctx.enqueue(SaveRequirement(requirement=req.model_copy(update={"status": "archived"})))
                children += 1
        return {"children": children}


def requirements_on_disk(root: Path) -> list[Requirement]:
    return [
        Requirement.model_validate(orjson.loads(durable.read(root, p.relative_to(root).as_posix())))
        for p in (Path(root) / "requirements").glob("REQ-*/requirement.json")
    ]


class PublishReport(Payload):
    """Render a project's status report to ``reports/<slug>.md``."""

    job_type: ClassVar[str] = "publish_report"
    slug: str = Field(pattern=r"^[a-z][a-z0-9-]*$")


class PublishReportType(JobType[PublishReport]):
    """Publishing twice while a publish is still queued is one job (the idempotency key). With
    ``fail_first_attempt``, the first attempt raises as if the reports share were unreachable."""

    name = "publish_report"
    payload_model = PublishReport
    probe = ExistsProbe(PublishReport, lambda p: report_path(p.slug))

    def __init__(self, *, fail_first_attempt: bool = False) -> None:
        self.fail_first_attempt = fail_first_attempt

    def idempotency_key(self, payload: PublishReport) -> str:
        return f"report:{payload.slug}"

    def target(self, payload: PublishReport) -> Target:
        return Target.file(report_path(payload.slug))

    def run(self, payload: PublishReport, ctx: JobContext) -> dict[str, Any]:
        if self.fail_first_attempt and ctx.job.attempts == 1:
            raise RetryableError("simulated outage: the reports share is not reachable yet")
        reqs = sorted((r for r in requirements_on_disk(ctx.root) if r.project == payload.slug), key=lambda r: r.id)
        lines = [f"# Report: {payload.slug}\n\n"] + [f"- {r.id} [{r.status}] {r.title}\n" for r in reqs]
        write_file(ctx, report_path(payload.slug), "".join(lines).encode())
        return {"requirements": len(reqs)}


def register(registry: Registry, *, flaky: bool = False) -> Registry:
    """Add the sample application's job types (``tether --import tether.demo.app``)."""
    registry.register(SaveRequirementType())
    registry.register(ArchiveProjectType())
    registry.register(PublishReportType(fail_first_attempt=flaky))
    return registry
