"""``sqs_queue``: attributes, tags, dead-letter redrive to another tether-managed queue."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson
from pydantic import BaseModel, ConfigDict, Field

from ...errors import PermanentError, RetryableError
from .attributes import AttributesConfig, AttributeSet
from .clients import Aws
from .errors import with_not_found_retry
from .resource import Current, IdRule, Listing, ResourceType, Wanted, register
from .tags import with_owner

_NAME = re.compile(r"[A-Za-z0-9_-]{1,75}(\.fifo)?")

ATTRIBUTES = AttributeSet(
    "SQS",
    frozenset(
        {
            "DelaySeconds",
            "MaximumMessageSize",
            "MessageRetentionPeriod",
            "ReceiveMessageWaitTimeSeconds",
            "VisibilityTimeout",
            "KmsMasterKeyId",
            "KmsDataKeyReusePeriodSeconds",
            "SqsManagedSseEnabled",
            "FifoQueue",
            "ContentBasedDeduplication",
            "DeduplicationScope",
            "FifoThroughputLimit",
            "Policy",
        }
    ),
    json_names=frozenset({"Policy"}),
)


class DeadLetter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: str = Field(description="name of another tether-managed queue in the same region")
    max_receive_count: int = Field(ge=1, le=1000)


class SqsQueueConfig(AttributesConfig):
    attribute_set: ClassVar[AttributeSet] = ATTRIBUTES

    dead_letter: DeadLetter | None = None


class SqsQueue(ResourceType[SqsQueueConfig]):
    name = "sqs_queue"
    id_rule = IdRule(
        _NAME, "an SQS queue name is 1-80 characters: letters, digits, '-' and '_' (FIFO: ending in .fifo)"
    )
    canonical = {"attributes": ATTRIBUTES.canonical}
    listing = Listing("sqs", re.compile(r"([^:]+)"))

    def fetch(self, aws: Aws, resource_id: str, *, full: bool) -> Current:
        sqs = aws.client("sqs")
        url = str(sqs.get_queue_url(QueueName=resource_id)["QueueUrl"])
        tags = dict(sqs.list_queue_tags(QueueUrl=url).get("Tags", {}))
        identity: dict[str, Any] = {"url": url}
        facts: dict[str, Any] = {}
        if full:
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]).get("Attributes", {})
            identity["arn"] = attributes.get("QueueArn")
            facts["attributes"] = ATTRIBUTES.canonical(attributes)
            facts["dead_letter"] = _dead_letter(attributes.get("RedrivePolicy"))
        return Current.tagged(tags, facts, identity)

    def _redrive(self, aws: Aws, dead_letter: Mapping[str, Any] | None) -> str:
        if dead_letter is None:
            return ""
        dlq = self.read(aws, dead_letter["queue"], full=True)
        if dlq is None:
            raise RetryableError(f"dead-letter queue {dead_letter['queue']} does not exist yet (sync it first)")
        if dlq.owner != aws.owner:
            raise PermanentError(f"dead-letter queue {dead_letter['queue']} is not managed by this tether ledger")
        return orjson.dumps(
            {"deadLetterTargetArn": dlq.identity["arn"], "maxReceiveCount": str(dead_letter["max_receive_count"])}
        ).decode()

    def _attributes(self, aws: Aws, desired: Mapping[str, Any], names: set[str] | None = None) -> dict[str, str]:
        out = {
            k: ATTRIBUTES.as_sent(k, v)
            for k, v in (desired.get("attributes") or {}).items()
            if names is None or k in names
        }
        if "dead_letter" in desired and (names is None or "dead_letter" in names):
            out["RedrivePolicy"] = self._redrive(aws, desired["dead_letter"])
        return out

    def create(self, aws: Aws, wanted: Wanted) -> None:
        sqs = aws.client("sqs")
        attributes = {k: v for k, v in self._attributes(aws, wanted.desired).items() if v != ""}
        tags = with_owner(wanted.desired.get("tags"), aws.owner)
        sqs.create_queue(QueueName=wanted.resource_id, Attributes=attributes, tags=tags)
        with_not_found_retry(aws, lambda: sqs.get_queue_url(QueueName=wanted.resource_id))

    def change(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None:
        if "attributes" in fields or "dead_letter" in fields:
            want = wanted.desired.get("attributes") or {}
            have = current.facts.get("attributes") or {}
            names = {k for k in want if want[k] != have.get(k)}
            if "dead_letter" in fields:
                names.add("dead_letter")
            changes = self._attributes(aws, wanted.desired, names)
            if changes:
                aws.client("sqs").set_queue_attributes(QueueUrl=current.identity["url"], Attributes=changes)

    def tag(self, aws: Aws, resource_id: str, current: Current, tags: dict[str, str]) -> None:
        aws.client("sqs").tag_queue(QueueUrl=current.identity["url"], Tags=tags)

    def untag(self, aws: Aws, resource_id: str, current: Current, keys: list[str]) -> None:
        aws.client("sqs").untag_queue(QueueUrl=current.identity["url"], TagKeys=keys)

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("sqs").delete_queue(QueueUrl=current.identity["url"])


def _dead_letter(redrive: str | None) -> dict[str, Any] | None:
    if not redrive:
        return None
    policy = orjson.loads(redrive)
    return {
        "queue": str(policy.get("deadLetterTargetArn", "")).rsplit(":", 1)[-1],
        "max_receive_count": int(policy.get("maxReceiveCount", 0)),
    }


register(SqsQueue())
