"""Attribute maps, as SNS topics and SQS queues hold their settings: AWS's own names, string
values, some of them JSON documents (policies)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from pydantic import field_validator

from .resource import ResourceConfig


@dataclass(frozen=True)
class AttributeSet:
    """The attributes of one service that a config may declare."""

    service: str
    """As the service names itself in its errors (``SNS``)."""
    names: frozenset[str]
    json_names: frozenset[str]
    """Those holding a JSON document: compared parsed, so spacing and key order do not count."""

    def check(self, attributes: Mapping[str, Any] | None) -> None:
        unknown = sorted(set(attributes or ()) - self.names)
        if unknown:
            raise ValueError(
                f"unknown {self.service} attribute(s) {', '.join(unknown)}; known: {', '.join(sorted(self.names))}"
            )

    def canonical(self, attributes: Mapping[str, Any] | None) -> dict[str, Any]:
        """The known attributes in the shape the service's Get*Attributes call answers, sorted:
        strings, booleans lowercase, and the JSON documents parsed, so desired and current
        compare as equal."""
        return {k: self._value(k, v) for k, v in sorted((attributes or {}).items()) if k in self.names}

    def _value(self, name: str, v: Any) -> Any:
        if name in self.json_names:
            return (orjson.loads(v) if v else None) if isinstance(v, str) else v
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v)

    def as_sent(self, name: str, value: Any) -> Any:
        """A canonical value as the Set*Attributes call takes it: a JSON document as text again."""
        return orjson.dumps(value).decode() if name in self.json_names else value


class AttributesConfig(ResourceConfig):
    """A resource whose settings are its service's attributes; only known names are accepted."""

    attribute_set: ClassVar[AttributeSet]
    partial: ClassVar[frozenset[str]] = frozenset({"attributes"})  # AWS fills in every attribute

    attributes: dict[str, str | int | bool] | None = None

    @field_validator("attributes")
    @classmethod
    def _known(cls, attributes: dict[str, Any] | None) -> dict[str, Any] | None:
        cls.attribute_set.check(attributes)
        return attributes
