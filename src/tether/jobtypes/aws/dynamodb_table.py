"""``dynamodb_table``: key schema, billing mode, tags, TTL."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...errors import PermanentError, RetryableError
from .common import (
    OWNER_TAG,
    Aws,
    Current,
    ResourceConfig,
    ResourceType,
    is_not_found,
    register,
    remove_keys,
    tags_from_list,
    tags_to_list,
    user_tags,
)

_NAME = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")


class Key(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    type: Literal["S", "N", "B"] = "S"


class Ttl(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    attribute: str = Field(min_length=1)
    enabled: bool = True


class DynamoDbTableConfig(ResourceConfig):
    hash_key: Key | None = None
    range_key: Key | None = None
    billing_mode: Literal["PAY_PER_REQUEST", "PROVISIONED"] | None = None
    read_capacity: int | None = Field(default=None, ge=1)
    write_capacity: int | None = Field(default=None, ge=1)
    ttl: Ttl | None = None

    @model_validator(mode="after")
    def _complete(self) -> DynamoDbTableConfig:
        if self.state == "present" and self.hash_key is None:
            raise ValueError("hash_key is required for a present table")
        if self.billing_mode == "PROVISIONED" and (self.read_capacity is None or self.write_capacity is None):
            raise ValueError("PROVISIONED billing needs read_capacity and write_capacity")
        return self


class DynamoDbTable(ResourceType):
    name = "dynamodb_table"
    service = "dynamodb"
    config_model = DynamoDbTableConfig

    def check_id(self, resource_id: str) -> str | None:
        if not _NAME.match(resource_id):
            return "a DynamoDB table name is 3-255 characters: letters, digits, '_', '-' and '.'"
        return None

    def desired(self, config: Mapping[str, Any], root: Path | None = None) -> dict[str, Any]:
        model = DynamoDbTableConfig.model_validate(config)
        dumped = model.model_dump(mode="json")
        out = {k: dumped[k] for k in sorted(model.model_fields_set) if k != "state"}
        if "hash_key" in out and "range_key" not in out:
            out["range_key"] = None  # declaring the key schema declares it whole
        if "tags" in out:
            out["tags"] = dict(sorted((out["tags"] or {}).items()))
        return out

    def read(self, aws: Aws, resource_id: str, *, full: bool = True) -> Current | None:
        ddb = aws.client("dynamodb")
        try:
            table = ddb.describe_table(TableName=resource_id)["Table"]
            arn = table["TableArn"]
            tags = tags_from_list(ddb.list_tags_of_resource(ResourceArn=arn).get("Tags"))
        except Exception as e:
            if is_not_found(e):
                return None
            raise
        facts: dict[str, Any] = {"tags": user_tags(tags)}
        if full:
            types = {a["AttributeName"]: a["AttributeType"] for a in table.get("AttributeDefinitions", [])}
            keys = {k["KeyType"]: k["AttributeName"] for k in table.get("KeySchema", [])}
            facts["hash_key"] = {"name": keys.get("HASH"), "type": types.get(keys.get("HASH", ""))}
            facts["range_key"] = {"name": keys["RANGE"], "type": types.get(keys["RANGE"])} if "RANGE" in keys else None
            billing = table.get("BillingModeSummary", {}).get("BillingMode") or "PROVISIONED"
            facts["billing_mode"] = billing
            throughput = table.get("ProvisionedThroughput", {})
            if billing == "PROVISIONED":
                facts["read_capacity"] = throughput.get("ReadCapacityUnits")
                facts["write_capacity"] = throughput.get("WriteCapacityUnits")
            ttl = ddb.describe_time_to_live(TableName=resource_id).get("TimeToLiveDescription", {})
            status = ttl.get("TimeToLiveStatus")
            facts["ttl"] = (
                {"attribute": ttl.get("AttributeName"), "enabled": status in ("ENABLED", "ENABLING")}
                if ttl.get("AttributeName")
                else None
            )
        return Current(facts, tags.get(OWNER_TAG), {"arn": arn, "status": table.get("TableStatus")})

    def create(self, aws: Aws, resource_id: str, desired: dict[str, Any], config: Mapping[str, Any]) -> None:
        ddb = aws.client("dynamodb")
        keys = [("HASH", desired["hash_key"])] + ([("RANGE", desired["range_key"])] if desired.get("range_key") else [])
        args: dict[str, Any] = {
            "TableName": resource_id,
            "KeySchema": [{"AttributeName": k["name"], "KeyType": kind} for kind, k in keys],
            "AttributeDefinitions": [{"AttributeName": k["name"], "AttributeType": k["type"]} for _, k in keys],
            "BillingMode": desired.get("billing_mode") or "PAY_PER_REQUEST",
            "Tags": tags_to_list({**(desired.get("tags") or {}), OWNER_TAG: aws.owner}),
        }
        if args["BillingMode"] == "PROVISIONED":
            args["ProvisionedThroughput"] = {
                "ReadCapacityUnits": desired["read_capacity"],
                "WriteCapacityUnits": desired["write_capacity"],
            }
        ddb.create_table(**args)
        if desired.get("ttl"):
            self._active(aws, resource_id)
            self._ttl(ddb, resource_id, desired["ttl"])

    def _active(self, aws: Aws, resource_id: str, seconds: float = 60.0) -> None:
        """A new table takes a while to become ACTIVE; TTL cannot be set before."""
        ddb = aws.client("dynamodb")
        deadline = time.monotonic() + seconds
        while ddb.describe_table(TableName=resource_id)["Table"].get("TableStatus") != "ACTIVE":
            if time.monotonic() >= deadline:
                raise RetryableError(f"table {resource_id} is not ACTIVE yet")
            aws.pause(1.0)

    def _ttl(self, ddb: Any, resource_id: str, ttl: Mapping[str, Any]) -> None:
        ddb.update_time_to_live(
            TableName=resource_id,
            TimeToLiveSpecification={"AttributeName": ttl["attribute"], "Enabled": ttl["enabled"]},
        )

    def update(
        self,
        aws: Aws,
        resource_id: str,
        desired: dict[str, Any],
        current: Current,
        fields: set[str],
        config: Mapping[str, Any],
    ) -> None:
        ddb = aws.client("dynamodb")
        if fields & {"hash_key", "range_key"}:
            raise PermanentError(
                f"table {resource_id}: a key schema cannot change in place; sync it absent, then present again"
            )
        if fields & {"billing_mode", "read_capacity", "write_capacity"}:
            mode = desired.get("billing_mode") or current.facts.get("billing_mode")
            args: dict[str, Any] = {"TableName": resource_id, "BillingMode": mode}
            if mode == "PROVISIONED":
                args["ProvisionedThroughput"] = {
                    "ReadCapacityUnits": desired.get("read_capacity"),
                    "WriteCapacityUnits": desired.get("write_capacity"),
                }
            ddb.update_table(**args)
        if "ttl" in fields and desired.get("ttl") is not None:
            self._ttl(ddb, resource_id, desired["ttl"])
        if "tags" in fields:
            arn = current.identity["arn"]
            want, have = desired.get("tags") or {}, current.facts.get("tags") or {}
            stale = remove_keys(have, want)
            if stale:
                ddb.untag_resource(ResourceArn=arn, TagKeys=stale)
            changed = {k: v for k, v in want.items() if have.get(k) != v}
            if changed:
                ddb.tag_resource(ResourceArn=arn, Tags=tags_to_list(changed))

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("dynamodb").delete_table(TableName=resource_id)

    def untracked_id(self, arn: str) -> str | None:
        parts = arn.split(":")
        if len(parts) == 6 and parts[2] == "dynamodb" and parts[5].startswith("table/") and parts[5].count("/") == 1:
            return parts[5][len("table/") :]
        return None

    def tagging_filter(self) -> str:
        return "dynamodb:table"


register(DynamoDbTable())
