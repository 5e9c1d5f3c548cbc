"""``s3_object``: an object (``<bucket>/<key>``) whose body is a data-root file or inline JSON,
with its content type, metadata and tags. The body is compared by MD5 (S3's ETag of a single
PUT), never shown."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
from pydantic import JsonValue, model_validator

from ... import fs
from ...errors import RetryableError
from .common import (
    OWNER_TAG,
    Aws,
    Current,
    ResourceConfig,
    ResourceType,
    error_code,
    is_not_found,
    register,
    tags_from_list,
    tags_to_list,
    user_tags,
)


class S3ObjectConfig(ResourceConfig):
    file: str | None = None
    """A path under the data root: its bytes when the job runs are the body."""
    content: JsonValue = None
    """Inline JSON, rendered indented with a final newline (as create_file writes it)."""
    content_type: str | None = None
    metadata: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one_body(self) -> S3ObjectConfig:
        has_content = "content" in self.model_fields_set
        if self.state == "present" and has_content == (self.file is not None):
            raise ValueError("give exactly one of 'file' (a data-root path) or 'content' (a JSON value)")
        return self


def _body(config: Mapping[str, Any], root: Path | None) -> bytes:
    if config.get("file") is not None:
        if root is None:
            raise RetryableError("no data root to read the body from")
        try:
            return fs.resolve(root, config["file"]).read_bytes()
        except FileNotFoundError:
            raise RetryableError(f"body file {config['file']} does not exist (yet)") from None
    return orjson.dumps(config.get("content"), option=orjson.OPT_INDENT_2) + b"\n"


def _split(resource_id: str) -> tuple[str, str]:
    bucket, _, key = resource_id.partition("/")
    return bucket, key


class S3Object(ResourceType):
    name = "s3_object"
    service = "s3"
    config_model = S3ObjectConfig

    def check_id(self, resource_id: str) -> str | None:
        bucket, key = _split(resource_id)
        if not bucket or not key:
            return "an S3 object is named '<bucket>/<key>'"
        return None

    def check_config(self, config: ResourceConfig, root: Path) -> list[str]:
        assert isinstance(config, S3ObjectConfig)
        if config.file is None:
            return []
        try:
            fs.canonical(root, config.file)
        except fs.PathRejected as e:
            return [f"config.file: {config.file!r} {e}; paths must be relative to the data root and stay inside it"]
        return []

    def desired(self, config: Mapping[str, Any], root: Path | None = None) -> dict[str, Any]:
        model = S3ObjectConfig.model_validate(config)
        out: dict[str, Any] = {}
        if model.state == "present":
            out["md5"] = hashlib.md5(_body(config, root), usedforsecurity=False).hexdigest()
            out["content_type"] = model.content_type or (
                "application/json" if model.file is None else "binary/octet-stream"
            )
        if "metadata" in model.model_fields_set:
            out["metadata"] = dict(sorted((model.metadata or {}).items()))
        if "tags" in model.model_fields_set:
            out["tags"] = dict(sorted((model.tags or {}).items()))
        return out

    def read(self, aws: Aws, resource_id: str, *, full: bool = True) -> Current | None:
        s3 = aws.client("s3")
        bucket, key = _split(resource_id)
        try:
            head = s3.head_object(Bucket=bucket, Key=key)
            tags = tags_from_list(s3.get_object_tagging(Bucket=bucket, Key=key).get("TagSet"))
        except Exception as e:
            if is_not_found(e) or error_code(e) == "NoSuchKey":
                return None
            raise
        etag = str(head.get("ETag", "")).strip('"')
        facts: dict[str, Any] = {
            "tags": user_tags(tags),
            "md5": etag if "-" not in etag else None,
            "content_type": head.get("ContentType"),
            "metadata": dict(sorted(head.get("Metadata", {}).items())),
        }
        identity = {"etag": etag, "version_id": head.get("VersionId")}
        return Current(facts, tags.get(OWNER_TAG), identity)

    def _put(self, aws: Aws, resource_id: str, desired: dict[str, Any], config: Mapping[str, Any]) -> None:
        bucket, key = _split(resource_id)
        aws.client("s3").put_object(
            Bucket=bucket,
            Key=key,
            Body=_body(config, aws.root),
            ContentType=desired["content_type"],
            Metadata=desired.get("metadata") or {},
            Tagging=urlencode({**(desired.get("tags") or {}), OWNER_TAG: aws.owner}),
        )

    def create(self, aws: Aws, resource_id: str, desired: dict[str, Any], config: Mapping[str, Any]) -> None:
        self._put(aws, resource_id, desired, config)

    def update(
        self,
        aws: Aws,
        resource_id: str,
        desired: dict[str, Any],
        current: Current,
        fields: set[str],
        config: Mapping[str, Any],
    ) -> None:
        if fields & {"md5", "content_type", "metadata"}:
            self._put(aws, resource_id, desired, config)  # a body, type or metadata change is a new PUT
        elif "tags" in fields:
            bucket, key = _split(resource_id)
            tags = {**(desired.get("tags") or {}), OWNER_TAG: aws.owner}
            aws.client("s3").put_object_tagging(Bucket=bucket, Key=key, Tagging={"TagSet": tags_to_list(tags)})

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        bucket, key = _split(resource_id)
        aws.client("s3").delete_object(Bucket=bucket, Key=key)


register(S3Object())
