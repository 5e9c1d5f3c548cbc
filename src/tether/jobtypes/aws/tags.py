"""Tags: tether's ownership tag, AWS's two shapes of a tag set, and the user's tags beside tether's own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

OWNER_TAG = "tether:managed-by"
"""Tag on every resource tether creates: the ledger's id (``Coordinator.ledger_id``)."""
TETHER_PREFIX = "tether:"
"""Tags under this prefix are tether's own: never declared in a config, never compared."""


def tags_from_list(items: Iterable[Mapping[str, Any]] | None, key: str = "Key", value: str = "Value") -> dict[str, str]:
    """AWS's ``[{"Key": k, "Value": v}]`` as a sorted dict."""
    return {str(i[key]): str(i[value]) for i in sorted(items or (), key=lambda i: str(i[key]))}


def tags_to_list(tags: Mapping[str, str], key: str = "Key", value: str = "Value") -> list[dict[str, str]]:
    return [{key: k, value: v} for k, v in sorted(tags.items())]


def user_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """Tags without tether's own (compared and reported: the ownership tag is tether's business)."""
    return {k: v for k, v in sorted(tags.items()) if not k.startswith(TETHER_PREFIX)}


def with_owner(tags: Mapping[str, str] | None, owner: str) -> dict[str, str]:
    """The tags a resource of ours carries: the declared ones and tether's ownership tag."""
    return {**(tags or {}), OWNER_TAG: owner}


def stale_keys(tags: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """User tags present but not wanted (tether's own are kept)."""
    return [k for k in tags if k not in wanted and not k.startswith(TETHER_PREFIX)]
