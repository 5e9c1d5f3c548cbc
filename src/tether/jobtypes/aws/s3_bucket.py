"""``s3_bucket``: versioning, tags, lifecycle rules, public-access block."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from .clients import Aws
from .errors import NotOurs, error_code
from .resource import Current, IdRule, Listing, ResourceConfig, ResourceType, Wanted, register
from .tags import OWNER_TAG, tags_from_list, tags_to_list, with_owner

_NAME = re.compile(r"(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


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


def _by_id(rules: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    return None if rules is None else sorted(rules, key=lambda r: r["id"])


class S3Bucket(ResourceType[S3BucketConfig]):
    name = "s3_bucket"
    id_rule = IdRule(_NAME, "an S3 bucket name is 3-63 characters: lowercase letters, digits, '.' and '-'")
    canonical = {"lifecycle_rules": _by_id}
    listing = Listing("s3:bucket", re.compile(r"([^/]+)"))

    def fetch(self, aws: Aws, resource_id: str, *, full: bool) -> Current:
        s3 = aws.client("s3")
        s3.head_bucket(Bucket=resource_id)
        tags = self._tags(s3, resource_id)
        facts: dict[str, Any] = {}
        if full:
            status = s3.get_bucket_versioning(Bucket=resource_id).get("Status")
            facts["versioning"] = status == "Enabled"
            facts["lifecycle_rules"] = self._rules(s3, resource_id)
            facts["public_access_block"] = self._pab(s3, resource_id)
        current = Current.tagged(tags, facts, {"arn": f"arn:aws:s3:::{resource_id}"})
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

    def create(self, aws: Aws, wanted: Wanted) -> None:
        s3 = aws.client("s3")
        resource_id = wanted.resource_id
        args: dict[str, Any] = {"Bucket": resource_id}
        if aws.region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": aws.region}
        try:
            s3.create_bucket(**args)
        except Exception as e:
            if error_code(e) == "BucketAlreadyExists":  # another account's: names are global
                raise NotOurs(self.describe(aws, resource_id), None) from None
            raise
        self.retag(aws, resource_id, Current({}, aws.owner), wanted.desired.get("tags") or {})
        self.change(aws, wanted, Current({}, aws.owner), set(wanted.desired))

    def retag(self, aws: Aws, resource_id: str, current: Current, wanted: Mapping[str, str]) -> None:
        tags = tags_to_list(with_owner(wanted, aws.owner))
        aws.client("s3").put_bucket_tagging(Bucket=resource_id, Tagging={"TagSet": tags})

    def change(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None:
        s3, resource_id, desired = aws.client("s3"), wanted.resource_id, wanted.desired
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
