"""``sqs_queue``: attributes, tags, dead-letter redrive to another tether-managed queue."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ...errors import PermanentError, RetryableError
from .common import (
    OWNER_TAG,
    Aws,
    Current,
    ResourceConfig,
    ResourceType,
    attributes_as_aws_returns_them,
    is_not_found,
    owner_tags,
    register,
    remove_keys,
    user_tags,
    with_not_found_retry,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,75}(\.fifo)?$")

ATTRIBUTES = frozenset(
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
)


class DeadLetter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: str = Field(description="name of another tether-managed queue in the same region")
    max_receive_count: int = Field(ge=1, le=1000)


class SqsQueueConfig(ResourceConfig):
    attributes: dict[str, str | int | bool] | None = None
    dead_letter: DeadLetter | None = None

    @field_validator("attributes")
    @classmethod
    def _known(cls, attributes: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(attributes or ()) - ATTRIBUTES)
        if unknown:
            raise ValueError(f"unknown SQS attribute(s) {', '.join(unknown)}; known: {', '.join(sorted(ATTRIBUTES))}")
        return attributes


_JSON_ATTRIBUTES = frozenset({"Policy"})


class SqsQueue(ResourceType):
    name = "sqs_queue"
    service = "sqs"
    config_model = SqsQueueConfig
    partial = frozenset({"attributes"})

    def check_id(self, resource_id: str) -> str | None:
        if not _NAME.match(resource_id):
            return "an SQS queue name is 1-80 characters: letters, digits, '-' and '_' (FIFO: ending in .fifo)"
        return None

    def desired(self, config: Mapping[str, Any], root: Path | None = None) -> dict[str, Any]:
        model = SqsQueueConfig.model_validate(config)
        out: dict[str, Any] = {}
        if "tags" in model.model_fields_set:
            out["tags"] = dict(sorted((model.tags or {}).items()))
        if "attributes" in model.model_fields_set:
            out["attributes"] = attributes_as_aws_returns_them(model.attributes or {}, _JSON_ATTRIBUTES)
        if "dead_letter" in model.model_fields_set:
            out["dead_letter"] = None if model.dead_letter is None else model.dead_letter.model_dump()
        return out

    def _url(self, aws: Aws, resource_id: str) -> str | None:
        try:
            return str(aws.client("sqs").get_queue_url(QueueName=resource_id)["QueueUrl"])
        except Exception as e:
            if is_not_found(e):
                return None
            raise

    def read(self, aws: Aws, resource_id: str, *, full: bool = True) -> Current | None:
        sqs = aws.client("sqs")
        url = self._url(aws, resource_id)
        if url is None:
            return None
        try:
            tags = dict(sqs.list_queue_tags(QueueUrl=url).get("Tags", {}))
            identity: dict[str, Any] = {"url": url}
            facts: dict[str, Any] = {"tags": user_tags(tags)}
            if full:
                attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]).get("Attributes", {})
                identity["arn"] = attributes.get("QueueArn")
                redrive = attributes.pop("RedrivePolicy", None)
                facts["attributes"] = attributes_as_aws_returns_them(
                    {k: v for k, v in attributes.items() if k in ATTRIBUTES}, _JSON_ATTRIBUTES
                )
                facts["dead_letter"] = _dead_letter(redrive)
        except Exception as e:
            if is_not_found(e):  # deleted between the two calls
                return None
            raise
        return Current(facts, tags.get(OWNER_TAG), identity)

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
            k: orjson.dumps(v).decode() if k == "Policy" else v
            for k, v in (desired.get("attributes") or {}).items()
            if names is None or k in names
        }
        if "dead_letter" in desired and (names is None or "dead_letter" in names):
            out["RedrivePolicy"] = self._redrive(aws, desired["dead_letter"])
        return out

    def create(self, aws: Aws, resource_id: str, desired: dict[str, Any], config: Mapping[str, Any]) -> None:
        sqs = aws.client("sqs")
        attributes = {k: v for k, v in self._attributes(aws, desired).items() if v != ""}
        sqs.create_queue(QueueName=resource_id, Attributes=attributes, tags=owner_tags(aws, desired.get("tags")))
        with_not_found_retry(aws, lambda: sqs.get_queue_url(QueueName=resource_id))

    def update(
        self,
        aws: Aws,
        resource_id: str,
        desired: dict[str, Any],
        current: Current,
        fields: set[str],
        config: Mapping[str, Any],
    ) -> None:
        sqs = aws.client("sqs")
        url = current.identity["url"]
        if "attributes" in fields or "dead_letter" in fields:
            want = desired.get("attributes") or {}
            have = current.facts.get("attributes") or {}
            names = {k for k in want if want[k] != have.get(k)}
            if "dead_letter" in fields:
                names.add("dead_letter")
            changes = self._attributes(aws, desired, names)
            if changes:
                sqs.set_queue_attributes(QueueUrl=url, Attributes=changes)
        if "tags" in fields:
            want_tags = desired.get("tags") or {}
            have_tags = current.facts.get("tags") or {}
            stale = remove_keys(have_tags, want_tags)
            if stale:
                sqs.untag_queue(QueueUrl=url, TagKeys=stale)
            changed = {k: v for k, v in want_tags.items() if have_tags.get(k) != v}
            if changed:
                sqs.tag_queue(QueueUrl=url, Tags=changed)

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("sqs").delete_queue(QueueUrl=current.identity["url"])

    def untracked_id(self, arn: str) -> str | None:
        parts = arn.split(":")
        return parts[5] if len(parts) == 6 and parts[2] == "sqs" else None

    def tagging_filter(self) -> str:
        return "sqs"


def _dead_letter(redrive: str | None) -> dict[str, Any] | None:
    if not redrive:
        return None
    policy = orjson.loads(redrive)
    return {
        "queue": str(policy.get("deadLetterTargetArn", "")).rsplit(":", 1)[-1],
        "max_receive_count": int(policy.get("maxReceiveCount", 0)),
    }


register(SqsQueue())
