"""``sns_topic``: attributes, tags, SQS subscriptions (to tether-managed queues)."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from ...errors import PermanentError, RetryableError
from .attributes import AttributesConfig, AttributeSet
from .clients import Aws
from .resource import Current, IdRule, Listing, ResourceType, Wanted, register
from .tags import tags_from_list, tags_to_list, with_owner

_NAME = re.compile(r"[A-Za-z0-9_-]{1,251}(\.fifo)?")

ATTRIBUTES = AttributeSet(
    "SNS",
    frozenset(
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
    ),
    json_names=frozenset({"Policy", "DeliveryPolicy"}),
)


class SnsTopicConfig(AttributesConfig):
    attribute_set: ClassVar[AttributeSet] = ATTRIBUTES

    subscriptions: list[str] | None = None
    """Names of tether-managed SQS queues in the same region, subscribed to the topic."""


def _queue_names(names: list[str] | None) -> list[str]:
    return sorted(set(names or ()))


class SnsTopic(ResourceType[SnsTopicConfig]):
    name = "sns_topic"
    id_rule = IdRule(
        _NAME, "an SNS topic name is 1-256 characters: letters, digits, '-' and '_' (FIFO: ending in .fifo)"
    )
    canonical = {"attributes": ATTRIBUTES.canonical, "subscriptions": _queue_names}
    listing = Listing("sns", re.compile(r"([^:]+)"))

    def fetch(self, aws: Aws, resource_id: str, *, full: bool) -> Current:
        sns = aws.client("sns")
        arn = aws.arn("sns", resource_id)
        attributes = sns.get_topic_attributes(TopicArn=arn).get("Attributes", {})
        tags = tags_from_list(sns.list_tags_for_resource(ResourceArn=arn).get("Tags"))
        facts: dict[str, Any] = {}
        if full:
            facts["attributes"] = ATTRIBUTES.canonical(attributes)
            facts["subscriptions"] = sorted(q for q, _ in self._subscriptions(sns, arn).values())
        return Current.tagged(tags, facts, {"arn": arn})

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

    def create(self, aws: Aws, wanted: Wanted) -> None:
        desired = wanted.desired
        attributes = {k: ATTRIBUTES.as_sent(k, v) for k, v in (desired.get("attributes") or {}).items()}
        tags = tags_to_list(with_owner(desired.get("tags"), aws.owner))
        aws.client("sns").create_topic(Name=wanted.resource_id, Attributes=attributes, Tags=tags)
        if desired.get("subscriptions"):
            self.change(aws, wanted, Current({"subscriptions": []}, aws.owner), {"subscriptions"})

    def change(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None:
        sns = aws.client("sns")
        arn = aws.arn("sns", wanted.resource_id)
        if "attributes" in fields:
            have = current.facts.get("attributes") or {}
            for k, v in (wanted.desired.get("attributes") or {}).items():
                if have.get(k) != v:
                    sns.set_topic_attributes(TopicArn=arn, AttributeName=k, AttributeValue=ATTRIBUTES.as_sent(k, v))
        if "subscriptions" in fields:
            existing = self._subscriptions(sns, arn)
            queues = {self._queue_arn(aws, q) for q in wanted.desired.get("subscriptions") or ()}
            for queue_arn in sorted(queues - existing.keys()):
                sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
            for queue_arn in sorted(existing.keys() - queues):
                sns.unsubscribe(SubscriptionArn=existing[queue_arn][1])

    def tag(self, aws: Aws, resource_id: str, current: Current, tags: dict[str, str]) -> None:
        aws.client("sns").tag_resource(ResourceArn=aws.arn("sns", resource_id), Tags=tags_to_list(tags))

    def untag(self, aws: Aws, resource_id: str, current: Current, keys: list[str]) -> None:
        aws.client("sns").untag_resource(ResourceArn=aws.arn("sns", resource_id), TagKeys=keys)

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("sns").delete_topic(TopicArn=current.identity["arn"])


register(SnsTopic())
