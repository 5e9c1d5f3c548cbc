"""``dynamodb_table``: key schema, billing mode, tags, TTL."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...errors import PermanentError, RetryableError
from .clients import Aws
from .resource import Current, IdRule, Listing, ResourceConfig, ResourceType, Wanted, register
from .tags import tags_from_list, tags_to_list, with_owner

_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")


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


class DynamoDbTable(ResourceType[DynamoDbTableConfig]):
    name = "dynamodb_table"
    id_rule = IdRule(_NAME, "a DynamoDB table name is 3-255 characters: letters, digits, '_', '-' and '.'")
    listing = Listing("dynamodb:table", re.compile(r"table/([^/:]+)"))

    def declared(self, model: DynamoDbTableConfig, root: Path | None) -> dict[str, Any]:
        out = super().declared(model, root)
        if "hash_key" in out and "range_key" not in out:
            out["range_key"] = None  # declaring the key schema declares it whole
        return out

    def fetch(self, aws: Aws, resource_id: str, *, full: bool) -> Current:
        ddb = aws.client("dynamodb")
        table = ddb.describe_table(TableName=resource_id)["Table"]
        arn = table["TableArn"]
        tags = tags_from_list(ddb.list_tags_of_resource(ResourceArn=arn).get("Tags"))
        facts: dict[str, Any] = {}
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
        return Current.tagged(tags, facts, {"arn": arn, "status": table.get("TableStatus")})

    def create(self, aws: Aws, wanted: Wanted) -> None:
        ddb, resource_id, desired = aws.client("dynamodb"), wanted.resource_id, wanted.desired
        keys = [("HASH", desired["hash_key"])] + ([("RANGE", desired["range_key"])] if desired.get("range_key") else [])
        args: dict[str, Any] = {
            "TableName": resource_id,
            "KeySchema": [{"AttributeName": k["name"], "KeyType": kind} for kind, k in keys],
            "AttributeDefinitions": [{"AttributeName": k["name"], "AttributeType": k["type"]} for _, k in keys],
            "BillingMode": desired.get("billing_mode") or "PAY_PER_REQUEST",
            "Tags": tags_to_list(with_owner(desired.get("tags"), aws.owner)),
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

    def change(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None:
        ddb, resource_id, desired = aws.client("dynamodb"), wanted.resource_id, wanted.desired
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

    def tag(self, aws: Aws, resource_id: str, current: Current, tags: dict[str, str]) -> None:
        aws.client("dynamodb").tag_resource(ResourceArn=current.identity["arn"], Tags=tags_to_list(tags))

    def untag(self, aws: Aws, resource_id: str, current: Current, keys: list[str]) -> None:
        aws.client("dynamodb").untag_resource(ResourceArn=current.identity["arn"], TagKeys=keys)

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("dynamodb").delete_table(TableName=resource_id)


register(DynamoDbTable())
