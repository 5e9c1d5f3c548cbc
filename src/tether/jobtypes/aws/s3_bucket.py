"""``s3_bucket``: versioning, tags, lifecycle rules, public-access block."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .common import (
    OWNER_TAG,
    Aws,
    Current,
    NotOurs,
    ResourceConfig,
    ResourceType,
    error_code,
    is_not_found,
    register,
    tags_from_list,
    tags_to_list,
    user_tags,
)

_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class LifecycleRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    prefix: str = ""
    enabled: bool = True
    expiration_days: int | None = None
    noncurrent_expiration_days: int | None = None


class PublicAccessBlock(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    block_public_acls: bool = True
    ignore_public_acls: bool = True
    block_public_policy: bool = True
    restrict_public_buckets: bool = True


class S3BucketConfig(ResourceConfig):
    versioning: bool | None = None
    lifecycle_rules: list[LifecycleRule] | None = None
    public_access_block: PublicAccessBlock | None = None


_PAB = {
    "block_public_acls": "BlockPublicAcls",
    "ignore_public_acls": "IgnorePublicAcls",
    "block_public_policy": "BlockPublicPolicy",
    "restrict_public_buckets": "RestrictPublicBuckets",
}


class S3Bucket(ResourceType):
    name = "s3_bucket"
    service = "s3"
    config_model = S3BucketConfig

    def check_id(self, resource_id: str) -> str | None:
        if not _NAME.match(resource_id) or ".." in resource_id:
            return "an S3 bucket name is 3-63 characters: lowercase letters, digits, '.' and '-'"
        return None

    def desired(self, config: Mapping[str, Any], root: Path | None = None) -> dict[str, Any]:
        model = S3BucketConfig.model_validate(config)
        dumped = model.model_dump(mode="json")
        out = {k: dumped[k] for k in sorted(model.model_fields_set) if k != "state"}
        if out.get("lifecycle_rules") is not None:
            out["lifecycle_rules"] = sorted(out["lifecycle_rules"], key=lambda r: r["id"])
        return out

    def read(self, aws: Aws, resource_id: str, *, full: bool = True) -> Current | None:
        s3 = aws.client("s3")
        try:
            s3.head_bucket(Bucket=resource_id)
        except Exception as e:
            if is_not_found(e):
                return None
            raise
        tags = self._tags(s3, resource_id)
        facts: dict[str, Any] = {"tags": user_tags(tags)}
        if full:
            status = s3.get_bucket_versioning(Bucket=resource_id).get("Status")
            facts["versioning"] = status == "Enabled"
            facts["lifecycle_rules"] = self._rules(s3, resource_id)
            facts["public_access_block"] = self._pab(s3, resource_id)
        current = Current(facts, tags.get(OWNER_TAG), {"arn": f"arn:aws:s3:::{resource_id}"})
        if OWNER_TAG not in tags:
            current.created_at = self._created(s3, resource_id)
        return current

    def _tags(self, s3: Any, bucket: str) -> dict[str, str]:
        try:
            return tags_from_list(s3.get_bucket_tagging(Bucket=bucket).get("TagSet"))
        except Exception as e:
            if error_code(e) == "NoSuchTagSet":
                return {}
            raise

    def _rules(self, s3: Any, bucket: str) -> list[dict[str, Any]]:
        try:
            rules = s3.get_bucket_lifecycle_configuration(Bucket=bucket).get("Rules", [])
        except Exception as e:
            if error_code(e) == "NoSuchLifecycleConfiguration":
                return []
            raise
        out = []
        for r in rules:
            prefix = r.get("Filter", {}).get("Prefix", r.get("Prefix", ""))
            out.append(
                {
                    "id": r.get("ID", ""),
                    "prefix": prefix or "",
                    "enabled": r.get("Status") == "Enabled",
                    "expiration_days": r.get("Expiration", {}).get("Days"),
                    "noncurrent_expiration_days": r.get("NoncurrentVersionExpiration", {}).get("NoncurrentDays"),
                }
            )
        return sorted(out, key=lambda r: r["id"])

    def _pab(self, s3: Any, bucket: str) -> dict[str, bool] | None:
        try:
            block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
        except Exception as e:
            if error_code(e) == "NoSuchPublicAccessBlockConfiguration":
                return None
            raise
        return {ours: bool(block.get(theirs, False)) for ours, theirs in _PAB.items()}

    def _created(self, s3: Any, bucket: str) -> float | None:
        for b in s3.list_buckets().get("Buckets", []):
            if b["Name"] == bucket:
                return float(b["CreationDate"].timestamp())
        return None

    def adopt_untagged(self, current: Current, enqueued_at: float, attempt: int) -> bool:
        # CreateBucket takes no tags (in moto and most regions): an attempt that died between it
        # and PutBucketTagging leaves our bucket untagged. Only a retry may adopt one, and only a
        # bucket created after this job was enqueued.
        return attempt > 1 and current.created_at is not None and current.created_at >= enqueued_at - 1.0

    def create(self, aws: Aws, resource_id: str, desired: dict[str, Any], config: Mapping[str, Any]) -> None:
        s3 = aws.client("s3")
        args: dict[str, Any] = {"Bucket": resource_id}
        if aws.region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": aws.region}
        try:
            s3.create_bucket(**args)
        except Exception as e:
            if error_code(e) == "BucketAlreadyExists":  # another account's: names are global
                raise NotOurs(self.describe(aws, resource_id), None) from None
            raise
        self._put_tags(s3, resource_id, desired.get("tags") or {}, aws.owner)
        self.update(aws, resource_id, desired, Current({}, aws.owner), set(desired) - {"tags"}, config)

    def _put_tags(self, s3: Any, bucket: str, tags: Mapping[str, str], owner: str) -> None:
        s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": tags_to_list({**tags, OWNER_TAG: owner})})

    def update(
        self,
        aws: Aws,
        resource_id: str,
        desired: dict[str, Any],
        current: Current,
        fields: set[str],
        config: Mapping[str, Any],
    ) -> None:
        s3 = aws.client("s3")
        if "tags" in fields:
            self._put_tags(s3, resource_id, desired.get("tags") or {}, current.owner or aws.owner)
        if "versioning" in fields and desired.get("versioning") is not None:
            status = "Enabled" if desired["versioning"] else "Suspended"
            if desired["versioning"] or current.facts.get("versioning"):
                s3.put_bucket_versioning(Bucket=resource_id, VersioningConfiguration={"Status": status})
        if "lifecycle_rules" in fields and desired.get("lifecycle_rules") is not None:
            rules = desired["lifecycle_rules"]
            if not rules:
                s3.delete_bucket_lifecycle(Bucket=resource_id)
            else:
                s3.put_bucket_lifecycle_configuration(
                    Bucket=resource_id, LifecycleConfiguration={"Rules": [_rule(r) for r in rules]}
                )
        if "public_access_block" in fields:
            block = desired.get("public_access_block")
            if block is None:
                s3.delete_public_access_block(Bucket=resource_id)
            else:
                s3.put_public_access_block(
                    Bucket=resource_id,
                    PublicAccessBlockConfiguration={theirs: block[ours] for ours, theirs in _PAB.items()},
                )

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("s3").delete_bucket(Bucket=resource_id)

    def untracked_id(self, arn: str) -> str | None:
        prefix = "arn:aws:s3:::"
        return arn[len(prefix) :] if arn.startswith(prefix) and "/" not in arn[len(prefix) :] else None

    def tagging_filter(self) -> str:
        return "s3:bucket"


def _rule(r: Mapping[str, Any]) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "ID": r["id"],
        "Filter": {"Prefix": r["prefix"]},
        "Status": "Enabled" if r["enabled"] else "Disabled",
    }
    if r.get("expiration_days") is not None:
        rule["Expiration"] = {"Days": r["expiration_days"]}
    if r.get("noncurrent_expiration_days") is not None:
        rule["NoncurrentVersionExpiration"] = {"NoncurrentDays": r["noncurrent_expiration_days"]}
    return rule


register(S3Bucket())
