"""``ssm_parameter``: value, type, description, tags. The value is compared by digest and never
shown: a parameter is often a secret."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

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

_NAME = re.compile(r"^/?[A-Za-z0-9_.\-/]{1,1011}$")


class SsmParameterConfig(ResourceConfig):
    value: str | None = None
    type: Literal["String", "StringList", "SecureString"] | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _valued(self) -> SsmParameterConfig:
        if self.state == "present" and self.value is None:
            raise ValueError("value is required for a present parameter")
        return self


def digest(value: str) -> str:
    """How a parameter's value is compared and reported: a digest, never the value."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


class SsmParameter(ResourceType):
    name = "ssm_parameter"
    service = "ssm"
    config_model = SsmParameterConfig

    def check_id(self, resource_id: str) -> str | None:
        if not _NAME.match(resource_id) or resource_id.lower().startswith(("aws", "ssm", "/aws", "/ssm")):
            return "an SSM parameter name is letters, digits, '_', '.', '-' and '/', not starting with aws or ssm"
        return None

    def desired(self, config: Mapping[str, Any], root: Path | None = None) -> dict[str, Any]:
        model = SsmParameterConfig.model_validate(config)
        out: dict[str, Any] = {}
        if model.value is not None:
            out["value"] = digest(model.value)
        out["type"] = model.type or "String"
        if "description" in model.model_fields_set:
            out["description"] = model.description
        if "tags" in model.model_fields_set:
            out["tags"] = dict(sorted((model.tags or {}).items()))
        return out

    def read(self, aws: Aws, resource_id: str, *, full: bool = True) -> Current | None:
        ssm = aws.client("ssm")
        try:
            param = ssm.get_parameter(Name=resource_id, WithDecryption=True)["Parameter"]
            tags = tags_from_list(
                ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId=resource_id).get("TagList")
            )
        except Exception as e:
            if is_not_found(e):
                return None
            raise
        facts: dict[str, Any] = {"tags": user_tags(tags), "value": digest(param["Value"]), "type": param["Type"]}
        if full:
            found = ssm.describe_parameters(ParameterFilters=[{"Key": "Name", "Values": [resource_id]}])["Parameters"]
            facts["description"] = found[0].get("Description") if found else None
        identity = {"arn": param.get("ARN"), "version": param.get("Version")}
        return Current(facts, tags.get(OWNER_TAG), identity)

    def _put(self, aws: Aws, resource_id: str, config: Mapping[str, Any], **args: Any) -> None:
        ssm_args: dict[str, Any] = {
            "Name": resource_id,
            "Value": config["value"],
            "Type": config.get("type") or "String",
        }
        if config.get("description") is not None:
            ssm_args["Description"] = config["description"]
        aws.client("ssm").put_parameter(**ssm_args, **args)

    def create(self, aws: Aws, resource_id: str, desired: dict[str, Any], config: Mapping[str, Any]) -> None:
        tags = tags_to_list({**(desired.get("tags") or {}), OWNER_TAG: aws.owner})
        self._put(aws, resource_id, config, Tags=tags)

    def update(
        self,
        aws: Aws,
        resource_id: str,
        desired: dict[str, Any],
        current: Current,
        fields: set[str],
        config: Mapping[str, Any],
    ) -> None:
        ssm = aws.client("ssm")
        if fields & {"value", "type", "description"}:
            self._put(aws, resource_id, config, Overwrite=True)
        if "tags" in fields:
            want, have = desired.get("tags") or {}, current.facts.get("tags") or {}
            stale = remove_keys(have, want)
            if stale:
                ssm.remove_tags_from_resource(ResourceType="Parameter", ResourceId=resource_id, TagKeys=stale)
            changed = {k: v for k, v in want.items() if have.get(k) != v}
            if changed:
                ssm.add_tags_to_resource(ResourceType="Parameter", ResourceId=resource_id, Tags=tags_to_list(changed))

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("ssm").delete_parameter(Name=resource_id)

    def untracked_id(self, arn: str) -> str | None:
        parts = arn.split(":", 5)
        if len(parts) == 6 and parts[2] == "ssm" and parts[5].startswith("parameter/"):
            rest = parts[5][len("parameter") :]
            return rest if rest.count("/") > 1 else rest[1:]
        return None

    def tagging_filter(self) -> str:
        return "ssm:parameter"


register(SsmParameter())
