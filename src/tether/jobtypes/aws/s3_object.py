"""``s3_object``: an object (``<bucket>/<key>``) whose body is a data-root file or inline JSON,
with its content type, metadata and tags. The body is compared by MD5 (S3's ETag of a single
PUT), never shown."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
from pydantic import JsonValue, model_validator

from ...errors import RetryableError
from ..datafiles import paths
from .clients import Aws
from .resource import Current, IdRule, ResourceConfig, ResourceType, Wanted, register
from .tags import tags_from_list, tags_to_list, with_owner

# '<bucket>/<key>': the bucket as s3_bucket's rule names one, then any key (a newline too).
_NAME = re.compile(r"(?![^/]*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/.+", re.DOTALL)


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


def _body(file: str | None, content: JsonValue, root: Path | None) -> bytes:
    if file is not None:
        if root is None:
            raise RetryableError("no data root to read the body from")
        try:
            return paths.resolve(root, file).read_bytes()
        except FileNotFoundError:
            raise RetryableError(f"body file {file} does not exist (yet)") from None
    return orjson.dumps(content, option=orjson.OPT_INDENT_2) + b"\n"


def _split(resource_id: str) -> tuple[str, str]:
    bucket, _, key = resource_id.partition("/")
    return bucket, key


_PUT = frozenset({"md5", "content_type", "metadata"})
"""What only a new PUT of the object changes."""


class S3Object(ResourceType[S3ObjectConfig]):
    name = "s3_object"
    id_rule = IdRule(_NAME, "an S3 object is named '<bucket>/<key>', the bucket a valid S3 bucket name")
    tagged_by_change = _PUT

    def check_config(self, config: S3ObjectConfig, root: Path) -> list[str]:
        if config.file is None:
            return []
        try:
            paths.canonical(root, config.file)
        except paths.PathRejected as e:
            return [f"config.file: {config.file!r} {e}; paths must be relative to the data root and stay inside it"]
        return []

    def declared(self, model: S3ObjectConfig, root: Path | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if model.state == "present":
            out["md5"] = hashlib.md5(_body(model.file, model.content, root), usedforsecurity=False).hexdigest()
            out["content_type"] = model.content_type or (
                "application/json" if model.file is None else "binary/octet-stream"
            )
        if "metadata" in model.model_fields_set:
            out["metadata"] = dict(sorted((model.metadata or {}).items()))
        return out

    def fetch(self, aws: Aws, resource_id: str, *, full: bool) -> Current:
        s3 = aws.client("s3")
        bucket, key = _split(resource_id)
        head = s3.head_object(Bucket=bucket, Key=key)
        tags = tags_from_list(s3.get_object_tagging(Bucket=bucket, Key=key).get("TagSet"))
        etag = str(head.get("ETag", "")).strip('"')
        facts: dict[str, Any] = {
            "md5": etag if "-" not in etag else None,
            "content_type": head.get("ContentType"),
            "metadata": dict(sorted(head.get("Metadata", {}).items())),
        }
        return Current.tagged(tags, facts, {"etag": etag, "version_id": head.get("VersionId")})

    def _put(self, aws: Aws, wanted: Wanted) -> None:
        bucket, key = _split(wanted.resource_id)
        aws.client("s3").put_object(
            Bucket=bucket,
            Key=key,
            Body=_body(wanted.config.get("file"), wanted.config.get("content"), aws.root),
            ContentType=wanted.desired["content_type"],
            Metadata=wanted.desired.get("metadata") or {},
            Tagging=urlencode(with_owner(wanted.desired.get("tags"), aws.owner)),
        )

    def create(self, aws: Aws, wanted: Wanted) -> None:
        self._put(aws, wanted)

    def change(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None:
        if fields & _PUT:
            self._put(aws, wanted)  # a new PUT: the tags go with it

    def retag(self, aws: Aws, resource_id: str, current: Current, wanted: Mapping[str, str]) -> None:
        bucket, key = _split(resource_id)
        tags = tags_to_list(with_owner(wanted, aws.owner))
        aws.client("s3").put_object_tagging(Bucket=bucket, Key=key, Tagging={"TagSet": tags})

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        bucket, key = _split(resource_id)
        aws.client("s3").delete_object(Bucket=bucket, Key=key)


register(S3Object())
