"""``sns_topic``: attributes, tags, SQS subscriptions (to tether-managed queues)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import field_validator

from ...errors import PermanentError, RetryableError
from .common import (
    OWNER_TAG,
    Aws,
    Current,
    ResourceConfig,
    ResourceType,
    attributes_as_aws_returns_them,
    is_not_found,
    register,
    remove_keys,
    tags_from_list,
    tags_to_list,
    user_tags,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,251}(\.fifo)?$")
ATTRIBUTES = frozenset(
    {
        "DisplayName",
        "Policy",
        "DeliveryPolicy",
        "KmsMasterKeyId",
        "FifoTopic",
        "ContentBasedDeduplication",
        "TracingConfig",
        "SignatureVersion",
    }
)


class SnsTopicConfig(ResourceConfig):
    attributes: dict[str, str | int | bool] | None = None
    subscriptions: list[str] | None = None
    """Names of tether-managed SQS queues in the same region, subscribed to the topic."""

    @field_validator("attributes")
    @classmethod
    def _known(cls, attributes: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(attributes or ()) - ATTRIBUTES)
        if unknown:
            raise ValueError(f"unknown SNS attribute(s) {', '.join(unknown)}; known: {', '.join(sorted(ATTRIBUTES))}")
        return attributes


_JSON_ATTRIBUTES = frozenset({"Policy", "DeliveryPolicy"})


class SnsTopic(ResourceType):
    name = "sns_topic"
    service = "sns"
    config_model = SnsTopicConfig
    partial = frozenset({"attributes"})

    def check_id(self, resource_id: str) -> str | None:
        if not _NAME.match(resource_id):
            return "an SNS topic name is 1-256 characters: letters, digits, '-' and '_' (FIFO: ending in .fifo)"
        return None

    def desired(self, config: Mapping[str, Any], root: Path | None = None) -> dict[str, Any]:
        model = SnsTopicConfig.model_validate(config)
        out: dict[str, Any] = {}
        if "tags" in model.model_fields_set:
            out["tags"] = dict(sorted((model.tags or {}).items()))
        if "attributes" in model.model_fields_set:
            out["attributes"] = attributes_as_aws_returns_them(model.attributes or {}, _JSON_ATTRIBUTES)
        if "subscriptions" in model.model_fields_set:
            out["subscriptions"] = sorted(set(model.subscriptions or ()))
        return out

    def read(self, aws: Aws, resource_id: str, *, full: bool = True) -> Current | None:
        sns = aws.client("sns")
        arn = aws.arn("sns", resource_id)
        try:
            attributes = sns.get_topic_attributes(TopicArn=arn).get("Attributes", {})
            tags = tags_from_list(sns.list_tags_for_resource(ResourceArn=arn).get("Tags"))
            facts: dict[str, Any] = {"tags": user_tags(tags)}
            if full:
                facts["attributes"] = attributes_as_aws_returns_them(
                    {k: v for k, v in attributes.items() if k in ATTRIBUTES}, _JSON_ATTRIBUTES
                )
                facts["subscriptions"] = sorted(q for q, _ in self._subscriptions(sns, arn).values())
        except Exception as e:
            if is_not_found(e):
                return None
            raise
        return Current(facts, tags.get(OWNER_TAG), {"arn": arn})

    def _subscriptions(self, sns: Any, arn: str) -> dict[str, tuple[str, str]]:
        """SQS subscriptions: queue ARN -> (queue name, subscription ARN)."""
        out = {}
        for page in sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=arn):
            for sub in page.get("Subscriptions", []):
                if sub.get("Protocol") == "sqs":
                    out[sub["Endpoint"]] = (sub["Endpoint"].rsplit(":", 1)[-1], sub["SubscriptionArn"])
        return out

    def _queue_arn(self, aws: Aws, name: str) -> str:
        from .sqs_queue import SqsQueue

        queue = SqsQueue().read(aws, name, full=True)
        if queue is None:
            raise RetryableError(f"queue {name} to subscribe does not exist yet (sync it first)")
        if queue.owner != aws.owner:
            raise PermanentError(f"queue {name} to subscribe is not managed by this tether ledger")
        return str(queue.identity["arn"])

    def create(self, aws: Aws, resource_id: str, desired: dict[str, Any], config: Mapping[str, Any]) -> None:
        sns = aws.client("sns")
        attributes = {
            k: orjson.dumps(v).decode() if isinstance(v, dict) else v
            for k, v in (desired.get("attributes") or {}).items()
        }
        sns.create_topic(
            Name=resource_id,
            Attributes=attributes,
            Tags=tags_to_list({**(desired.get("tags") or {}), OWNER_TAG: aws.owner}),
        )
        if desired.get("subscriptions"):
            self.update(aws, resource_id, desired, Current({"subscriptions": []}, aws.owner), {"subscriptions"}, config)

    def update(
        self,
        aws: Aws,
        resource_id: str,
        desired: dict[str, Any],
        current: Current,
        fields: set[str],
        config: Mapping[str, Any],
    ) -> None:
        sns = aws.client("sns")
        arn = aws.arn("sns", resource_id)
        if "attributes" in fields:
            have = current.facts.get("attributes") or {}
            for k, v in (desired.get("attributes") or {}).items():
                if have.get(k) != v:
                    sns.set_topic_attributes(
                        TopicArn=arn,
                        AttributeName=k,
                        AttributeValue=orjson.dumps(v).decode() if isinstance(v, dict) else v,
                    )
        if "tags" in fields:
            want, have_tags = desired.get("tags") or {}, current.facts.get("tags") or {}
            stale = remove_keys(have_tags, want)
            if stale:
                sns.untag_resource(ResourceArn=arn, TagKeys=stale)
            changed = {k: v for k, v in want.items() if have_tags.get(k) != v}
            if current.owner is None:
                changed[OWNER_TAG] = aws.owner
            if changed:
                sns.tag_resource(ResourceArn=arn, Tags=tags_to_list(changed))
        if "subscriptions" in fields:
            existing = self._subscriptions(sns, arn)
            wanted = {self._queue_arn(aws, q) for q in desired.get("subscriptions") or ()}
            for queue_arn in sorted(wanted - existing.keys()):
                sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
            for queue_arn in sorted(existing.keys() - wanted):
                sns.unsubscribe(SubscriptionArn=existing[queue_arn][1])

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("sns").delete_topic(TopicArn=current.identity["arn"])

    def untracked_id(self, arn: str) -> str | None:
        parts = arn.split(":")
        return parts[5] if len(parts) == 6 and parts[2] == "sns" else None

    def tagging_filter(self) -> str:
        return "sns"


register(SnsTopic())
