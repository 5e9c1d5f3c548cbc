"""``ssm_parameter``: value, type, description, tags. The value is compared by digest and never
shown: a parameter is often a secret."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from .clients import Aws
from .resource import Current, IdRule, Listing, ResourceConfig, ResourceType, Wanted, register
from .tags import tags_from_list, tags_to_list, with_owner

# AWS reserves names starting with aws or ssm, in any case, with or without the leading slash.
_NAME = re.compile(r"(?!/?(?i:aws|ssm))/?[A-Za-z0-9_.\-/]{1,1011}")


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


class SsmParameter(ResourceType[SsmParameterConfig]):
    name = "ssm_parameter"
    id_rule = IdRule(
        _NAME, "an SSM parameter name is letters, digits, '_', '.', '-' and '/', not starting with aws or ssm"
    )
    # A name in a hierarchy keeps its leading slash; a plain name has none (the ARN adds one).
    listing = Listing("ssm:parameter", re.compile(r"parameter(?:/([^/]+)|(/.+))"))

    def declared(self, model: SsmParameterConfig, root: Path | None) -> dict[str, Any]:
        out: dict[str, Any] = {"type": model.type or "String"}
        if model.value is not None:
            out["value"] = digest(model.value)
        if "description" in model.model_fields_set:
            out["description"] = model.description
        return out

    def fetch(self, aws: Aws, resource_id: str, *, full: bool) -> Current:
        ssm = aws.client("ssm")
        param = ssm.get_parameter(Name=resource_id, WithDecryption=True)["Parameter"]
        listed = ssm.list_tags_for_resource(ResourceType="Parameter", ResourceId=resource_id).get("TagList")
        facts: dict[str, Any] = {"value": digest(param["Value"]), "type": param["Type"]}
        if full:
            found = ssm.describe_parameters(ParameterFilters=[{"Key": "Name", "Values": [resource_id]}])["Parameters"]
            facts["description"] = found[0].get("Description") if found else None
        identity = {"arn": param.get("ARN"), "version": param.get("Version")}
        return Current.tagged(tags_from_list(listed), facts, identity)

    def _put(self, aws: Aws, resource_id: str, config: Mapping[str, Any], **args: Any) -> None:
        ssm_args: dict[str, Any] = {
            "Name": resource_id,
            "Value": config["value"],
            "Type": config.get("type") or "String",
        }
        if config.get("description") is not None:
            ssm_args["Description"] = config["description"]
        aws.client("ssm").put_parameter(**ssm_args, **args)

    def create(self, aws: Aws, wanted: Wanted) -> None:
        tags = tags_to_list(with_owner(wanted.desired.get("tags"), aws.owner))
        self._put(aws, wanted.resource_id, wanted.config, Tags=tags)

    def change(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None:
        if fields & {"value", "type", "description"}:
            self._put(aws, wanted.resource_id, wanted.config, Overwrite=True)

    def tag(self, aws: Aws, resource_id: str, current: Current, tags: dict[str, str]) -> None:
        aws.client("ssm").add_tags_to_resource(
            ResourceType="Parameter", ResourceId=resource_id, Tags=tags_to_list(tags)
        )

    def untag(self, aws: Aws, resource_id: str, current: Current, keys: list[str]) -> None:
        aws.client("ssm").remove_tags_from_resource(ResourceType="Parameter", ResourceId=resource_id, TagKeys=keys)

    def delete(self, aws: Aws, resource_id: str, current: Current) -> None:
        aws.client("ssm").delete_parameter(Name=resource_id)


register(SsmParameter())
