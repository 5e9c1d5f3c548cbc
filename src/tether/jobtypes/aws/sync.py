"""``sync_aws``: make one AWS resource match a desired state, idempotently; and its reconcile probe."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from pydantic import Field, JsonValue, ValidationError

from ... import config as settings
from ...errors import InvalidPayload, RetryableError
from ..base import IN_SYNC, MISSING, MODIFIED, UNEXPECTED, UNKNOWN, Check, JobType, Payload, Probe
from ..registry import describe as describe_validation
from ..target import AWS, Target
from .clients import Aws, Clients, default_region, require_boto3, shared_clients
from .errors import NotOurs, as_job_error, describe, is_not_found, is_transient, with_not_found_retry
from .resource import RESOURCES, Current, ResourceConfig, ResourceType, Wanted, changed_fields
from .tags import OWNER_TAG

if TYPE_CHECKING:
    from ..context import JobContext


class SyncAws(Payload):
    """Make the AWS resource ``resource_type`` / ``resource_id`` in ``region`` match ``config``: its
    full desired state, with ``state: present | absent`` (default present)."""

    job_type: ClassVar[str] = "sync_aws"

    resource_type: str
    resource_id: str = Field(min_length=1, max_length=900)
    config: dict[str, JsonValue] = Field(default_factory=dict)
    region: str | None = Field(default=None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$")


def resource_type_of(name: str) -> ResourceType[Any]:
    try:
        return RESOURCES[name]
    except KeyError:
        raise InvalidPayload(
            SyncAws.job_type, [f"resource_type: unknown {name!r}; known: {', '.join(sorted(RESOURCES))}"]
        ) from None


def target_of(resource_type: str, region: str, resource_id: str) -> Target:
    return Target(AWS, f"{resource_type}:{region}:{resource_id}")


class SyncAwsType(JobType[SyncAws]):
    name = "sync_aws"
    payload_model = SyncAws
    timeout = 300.0

    def prepare(self, payload: SyncAws, root: Path) -> SyncAws:
        """The config validated by the resource type's own model and stored in canonical form
        (only what was declared), the region resolved: the ordering key never changes later."""
        kind = resource_type_of(payload.resource_type)
        problems = []
        if (problem := kind.check_id(payload.resource_id)) is not None:
            problems.append(f"resource_id: {problem}")
        model: ResourceConfig | None = None
        try:
            model = kind.config_model.model_validate(payload.config)
        except ValidationError as e:
            problems.extend(f"config.{line}" for line in describe_validation(e))
        else:
            problems.extend(kind.check_config(model, root))
        if problems or model is None:
            raise InvalidPayload(self.name, problems)
        require_boto3()
        update: dict[str, Any] = {}
        canonical = model.model_dump(mode="json", exclude_unset=True)
        if canonical != payload.config:
            update["config"] = canonical
        if payload.region is None:
            region = default_region()
            if region is None:
                raise InvalidPayload(
                    self.name, ["region: not given, and boto3 has no default (AWS_REGION, AWS_DEFAULT_REGION)"]
                )
            update["region"] = region
        return payload.model_copy(update=update) if update else payload

    def target(self, payload: SyncAws) -> Target:
        return target_of(payload.resource_type, payload.region or "", payload.resource_id)

    def run(self, payload: SyncAws, ctx: JobContext) -> dict[str, Any]:
        kind = resource_type_of(payload.resource_type)
        assert payload.region is not None  # prepare resolved it
        aws = Aws(shared_clients(), payload.region, ctx.ledger_id, ctx.root, ctx.job.id, ctx.cancelled)
        what = kind.describe(aws, payload.resource_id)
        try:
            return self._apply(kind, aws, payload, ctx, what)
        except NotOurs:
            raise
        except Exception as e:
            raise as_job_error(e, what) from e

    def _apply(self, kind: ResourceType[Any], aws: Aws, payload: SyncAws, ctx: JobContext, what: str) -> dict[str, Any]:
        rid = payload.resource_id
        absent = payload.config.get("state") == "absent"
        wanted = Wanted(rid, kind.desired(payload.config, ctx.root), payload.config)
        current = kind.read(aws, rid, full=not absent)
        if current is not None and current.owner != aws.owner:
            enqueued = ctx.job.created_at.timestamp()
            if current.owner is not None or not kind.adopt_untagged(current, enqueued, ctx.job.attempts):
                raise NotOurs(what, current.owner)
        ctx.checkpoint()
        if absent:
            if current is None:
                return {"state": "absent", "changed": False}
            ctx.confirm_lease()
            kind.delete(aws, rid, current)
            return {"state": "absent", "changed": True, **current.identity}
        if current is None:
            ctx.confirm_lease()
            kind.create(aws, wanted)
            created = _read_back(kind, aws, rid)
            return {"state": "present", "changed": True, "created": True, **created.identity}
        fields = changed_fields(kind.diff(wanted.desired, current))
        if current.owner is None:
            fields.add("tags")  # adopting our own untagged resource: tag it
        if not fields:
            return {"state": "present", "changed": False, **current.identity}
        ctx.confirm_lease()
        kind.update(aws, wanted, current, fields)
        return {"state": "present", "changed": True, "fields": sorted(fields), **current.identity}


def _read_back(kind: ResourceType[Any], aws: Aws, rid: str) -> Current:
    """Read right after a create: NotFound for a moment is AWS's eventual consistency."""

    def read() -> Current:
        current = kind.read(aws, rid, full=False)
        if current is None:
            raise _NotYet()
        return current

    return with_not_found_retry(aws, read)  # type: ignore[no-any-return]


class _NotYet(Exception):
    response: ClassVar[dict[str, Any]] = {"Error": {"Code": "NotFound"}}


# -- reconcile -------------------------------------------------------------------------------


class SyncAwsProbe(Probe):
    """The resource still holds the declared state of its latest completed job: declared keys
    only, both sides canonical, tether's own tags left out. A pool of ``concurrency`` threads
    reads resources at once (boto3 clients are thread-safe)."""

    remote = "aws"

    def __init__(self, concurrency: int | None = None, clients: Clients | None = None) -> None:
        self.concurrency = concurrency
        self.clients = clients

    def check(self, target: str, payload: str, root: Path, *, content: bool) -> Check:
        return self.check_many([(target, payload)], root, content=content)[0]

    def check_many(self, items: Sequence[tuple[str, str]], root: Path, *, content: bool) -> list[Check]:
        workers = min(settings.aws_concurrency(self.concurrency), len(items))
        if workers <= 1:
            return [self._check(payload, content, root) for _, payload in items]
        with ThreadPoolExecutor(workers, thread_name_prefix="tether-aws-probe") as pool:
            return list(pool.map(lambda item: self._check(item[1], content, root), items))

    def _check(self, payload: str, content: bool, root: Path) -> Check:
        try:
            fields = orjson.loads(payload)
            kind = RESOURCES[fields["resource_type"]]
            rid, region, config = fields["resource_id"], fields["region"], fields.get("config") or {}
            absent = config.get("state") == "absent"
            desired = kind.desired(config, root)
        except RetryableError as e:  # the desired state cannot be known now (a body file is gone)
            return Check(UNKNOWN, detail=str(e))
        except Exception:  # only a row changed by hand: the ledger validated it
            return Check(UNKNOWN, detail="the job's stored payload could not be read")
        try:
            aws = Aws(self.clients or shared_clients(), region, root=root)
            current = kind.read(aws, rid, full=content and not absent)
        except Exception as e:
            if is_not_found(e):  # gone between two reads of one check: definitely NotFound
                current = None
            else:
                return Check(UNKNOWN, detail=_why(e))
        if absent:
            if current is None:
                return Check(IN_SYNC)
            return Check(
                UNEXPECTED, expected={"state": "absent"}, actual=current.identity, detail="declared absent, exists"
            )
        if current is None:
            return Check(MISSING, expected=desired, detail="AWS answered NotFound")
        if not content:
            return Check(IN_SYNC)
        differences = kind.diff(desired, current)
        if not differences:
            return Check(IN_SYNC)
        actual = {k: current.facts.get(k) for k in desired}
        return Check(MODIFIED, expected=desired, actual=actual, differences=differences)

    def untracked(self, owner: str, seen: set[str]) -> dict[str, str]:
        """Resources carrying ``owner``'s ownership tag (Resource Groups Tagging API), by target key,
        in every region a checked job named (and boto3's default region)."""
        regions = {Target.parse(key).identity.split(":")[1] for key in seen}
        if (region := default_region()) is not None:
            regions.add(region)
        filters = sorted({kind.listing.filter for kind in RESOURCES.values() if kind.listing is not None})
        found: dict[str, str] = {}
        for region in sorted(regions):
            tagging = (self.clients or shared_clients()).get("resourcegroupstaggingapi", region)
            pages = tagging.get_paginator("get_resources").paginate(
                TagFilters=[{"Key": OWNER_TAG, "Values": [owner]}], ResourceTypeFilters=filters
            )
            for page in pages:
                for item in page.get("ResourceTagMappingList", []):
                    arn = item["ResourceARN"]
                    for kind in RESOURCES.values():
                        rid = kind.untracked_id(arn)
                        if rid is not None:
                            found[target_of(kind.name, region, rid).key] = (
                                "carries this ledger's ownership tag; no job names it"
                            )
                            break
        return found


def _why(e: BaseException) -> str:
    """Why AWS could not be read (never ``missing``): throttled, access denied, no credentials,
    unreachable, or anything else."""
    text = describe(e)
    return f"could not read AWS ({'transient' if is_transient(e) else 'refused'}): {text}"


SyncAwsType.probe = SyncAwsProbe()
