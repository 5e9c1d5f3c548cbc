"""The base AWS resource type: what every kind of resource shares, with a hook for each of its own calls.

A kind (``s3_bucket``, ``sqs_queue``, ...) is a module with a ``ResourceType`` subclass, registered
in ``RESOURCES``. The base holds the skeleton: the name rule, the declared state in canonical form,
reading with NotFound as absent, the comparison, and the tags (ownership, the tag diff, re-tagging).
The subclass declares its rules as data and implements only its API calls: ``fetch``, ``create``,
``change``, ``delete``, and ``tag``/``untag`` (or ``retag``, where one call replaces the whole set).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, ConfigDict, field_validator

from ..base import ADD, NOT_EQUAL, REMOVE, Difference
from .clients import Aws
from .errors import is_not_found
from .tags import OWNER_TAG, TETHER_PREFIX, stale_keys, user_tags


class ResourceConfig(BaseModel):
    """A resource's desired state. Unknown fields are refused; ``tags`` never holds tether's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partial: ClassVar[frozenset[str]] = frozenset()
    """Declared mappings compared only on their declared keys (AWS fills in the rest)."""

    state: Literal["present", "absent"] = "present"
    tags: dict[str, str] | None = None

    @field_validator("tags")
    @classmethod
    def _no_tether_tags(cls, tags: dict[str, str] | None) -> dict[str, str] | None:
        if tags and any(k.startswith(TETHER_PREFIX) for k in tags):
            raise ValueError(f"tags under {TETHER_PREFIX!r} are tether's own and cannot be declared")
        return tags


@dataclass
class Current:
    """What AWS holds for one resource: its canonical facts (same shape as the desired state),
    the ownership tag's value, and its identity (ARN, URL, version id) for the job's result."""

    facts: dict[str, Any]
    owner: str | None
    identity: dict[str, Any] = field(default_factory=dict)
    created_at: float | None = None  # epoch seconds, where AWS says

    @classmethod
    def tagged(cls, tags: Mapping[str, str], facts: Mapping[str, Any], identity: dict[str, Any]) -> Current:
        """What a read found, from every tag the resource carries: the user's join the facts,
        tether's ownership tag names the owner."""
        return cls({"tags": user_tags(tags), **facts}, tags.get(OWNER_TAG), identity)


@dataclass(frozen=True)
class Wanted:
    """What one job wants of one resource: its id, the desired state in canonical form, and the
    config as declared (for what the desired state holds only a digest of: a body, a value)."""

    resource_id: str
    desired: dict[str, Any]
    config: Mapping[str, Any]


@dataclass(frozen=True)
class IdRule:
    """AWS's naming rule for a kind's resource ids: a pattern the whole id must match
    (``re.fullmatch``: with ``re.match``, a ``$`` also matches before a final newline), and the
    rule in words, for the one line that refuses an id."""

    pattern: re.Pattern[str]
    words: str

    def problem(self, resource_id: str) -> str | None:
        return None if self.pattern.fullmatch(resource_id) else self.words


@dataclass(frozen=True)
class Listing:
    """How the Resource Groups Tagging API lists a kind: its ResourceTypeFilters value
    (``service[:type]``, the service its ARNs name), and the resource part of those ARNs (after
    the account), the id in whichever group matched."""

    filter: str
    arn_resource: re.Pattern[str]

    def resource_id(self, arn: str) -> str | None:
        """The id in ``arn``, None if the ARN is not of this kind."""
        parts = arn.split(":", 5)
        if len(parts) != 6 or parts[2] != self.filter.split(":", 1)[0]:
            return None
        found = self.arn_resource.fullmatch(parts[5])
        return None if found is None else next(g for g in found.groups() if g is not None)


C = TypeVar("C", bound=ResourceConfig)


def _as_declared(value: Any) -> Any:
    return value


class ResourceType(ABC, Generic[C]):
    """One kind of AWS resource: the shared skeleton, and hooks for the kind's own API calls."""

    name: ClassVar[str]
    config_model: type[C]
    """The kind's config model: its type parameter (``ResourceType[SqsQueueConfig]``)."""
    id_rule: ClassVar[IdRule]
    canonical: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}
    """A declared field's canonical form, where it is not the value as declared (as AWS answers)."""
    tagged_by_change: ClassVar[frozenset[str]] = frozenset()
    """Fields whose change writes the tags in the same call (a new PUT): no separate re-tag."""
    listing: ClassVar[Listing | None] = None
    """How the tagging API lists this kind; None: it does not."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if get_origin(base) is ResourceType:
                (cls.config_model,) = get_args(base)

    def check_id(self, resource_id: str) -> str | None:
        """A problem with the resource id (AWS's naming rules), or None."""
        return self.id_rule.problem(resource_id)

    def check_config(self, config: C, root: Path) -> list[str]:
        """Problems the model cannot see alone (a body file's path against the data root)."""
        return []

    def desired(self, config: Mapping[str, Any], root: Path | None = None) -> dict[str, Any]:
        """The declared state in canonical form: only the keys the config declared (``root``: the
        data root, for a body read from a data file), in key order."""
        model = self.config_model.model_validate(config)
        out = self.declared(model, root)
        if "tags" in model.model_fields_set:
            out["tags"] = dict(sorted((model.tags or {}).items()))
        return dict(sorted(out.items()))

    def declared(self, model: C, root: Path | None) -> dict[str, Any]:
        """The kind's own declared fields in canonical form (``desired`` adds the tags): each field
        the config set, as JSON, through ``canonical``."""
        fields = model.model_fields_set - {"state", "tags"}
        dumped = model.model_dump(mode="json", include=fields)
        return {k: self.canonical.get(k, _as_declared)(v) for k, v in dumped.items()}

    def diff(self, desired: Mapping[str, Any], current: Current) -> tuple[Difference, ...]:
        return diff(desired, current.facts, partial=self.config_model.partial)

    def describe(self, aws: Aws, resource_id: str) -> str:
        return f"{self.name} {resource_id} in {aws.region}"

    def read(self, aws: Aws, resource_id: str, *, full: bool = True) -> Current | None:
        """AWS's state of the resource, None only on a definite NotFound (from any of its reads:
        it was deleted between two). ``full`` false: enough to know it exists and whose it is.
        Raises botocore's errors for anything else."""
        try:
            return self.fetch(aws, resource_id, full=full)
        except Exception as e:
            if is_not_found(e):
                return None
            raise

    @abstractmethod
    def fetch(self, aws: Aws, resource_id: str, *, full: bool) -> Current:
        """The kind's reads behind ``read`` (a NotFound they raise means the resource is absent)."""

    @abstractmethod
    def create(self, aws: Aws, wanted: Wanted) -> None:
        """Create it in the desired state, with the ownership tag in the creating call where the
        API allows (so a crash never leaves an untagged resource of ours)."""

    def update(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None:
        """Change only ``fields`` (those that differ) to their desired value: the kind's own
        first, then the tags."""
        self.change(aws, wanted, current, fields)
        if "tags" in fields and not fields & self.tagged_by_change:
            self.retag(aws, wanted.resource_id, current, wanted.desired.get("tags") or {})

    @abstractmethod
    def change(self, aws: Aws, wanted: Wanted, current: Current, fields: set[str]) -> None:
        """Change the kind's own ``fields`` among those that differ (``update`` re-tags)."""

    def retag(self, aws: Aws, resource_id: str, current: Current, wanted: Mapping[str, str]) -> None:
        """Make the user tags ``wanted`` and the resource ours: untag the stale keys, tag the
        changed ones (and the ownership tag, adopting one of ours that lacks it)."""
        have = current.facts.get("tags") or {}
        stale = stale_keys(have, wanted)
        if stale:
            self.untag(aws, resource_id, current, stale)
        changed = {k: v for k, v in wanted.items() if have.get(k) != v}
        if current.owner is None:
            changed[OWNER_TAG] = aws.owner
        if changed:
            self.tag(aws, resource_id, current, changed)

    def tag(self, aws: Aws, resource_id: str, current: Current, tags: dict[str, str]) -> None:
        """Add or overwrite ``tags`` (a kind whose API replaces the whole set overrides ``retag``)."""
        raise NotImplementedError(f"{self.name} replaces its tags in one call: retag")

    def untag(self, aws: Aws, resource_id: str, current: Current, keys: list[str]) -> None:
        """Remove the tags named ``keys``."""
        raise NotImplementedError(f"{self.name} replaces its tags in one call: retag")

    @abstractmethod
    def delete(self, aws: Aws, resource_id: str, current: Current) -> None: ...

    def adopt_untagged(self, current: Current, enqueued_at: float, attempt: int) -> bool:
        """Whether an untagged resource is ours after all: only for kinds whose create cannot
        tag in the same call (an earlier attempt died between the two)."""
        return False

    def untracked_id(self, arn: str) -> str | None:
        """The resource id in an ARN the tagging API listed, None if the ARN is not this kind's."""
        return None if self.listing is None else self.listing.resource_id(arn)


RESOURCES: dict[str, ResourceType[Any]] = {}


def register(resource_type: ResourceType[Any]) -> ResourceType[Any]:
    RESOURCES[resource_type.name] = resource_type
    return resource_type


def diff(
    expected: Mapping[str, Any], actual: Mapping[str, Any], *, partial: Iterable[str] = ()
) -> tuple[Difference, ...]:
    """The differences between the declared state and AWS's, both canonical, over the declared
    keys only. A declared mapping is compared key by key (``tags.env``); for one named in
    ``partial`` (attributes, where AWS fills in defaults) only its declared keys are, for the
    others (tags) every key is, so a tag added by hand is ADD."""
    out: list[Difference] = []
    partial = frozenset(partial)
    for name, want in expected.items():
        have = actual.get(name)
        if isinstance(want, dict):
            have = have if isinstance(have, dict) else {}
            keys = want.keys() if name in partial else want.keys() | have.keys()
            for k in sorted(keys):
                path = f"{name}.{k}"
                if k not in have:
                    out.append(Difference(path, want[k], None, REMOVE))
                elif k not in want:
                    out.append(Difference(path, None, have[k], ADD))
                elif want[k] != have[k]:
                    out.append(Difference(path, want[k], have[k], NOT_EQUAL))
        elif name not in actual or have is None:
            if want is not None:
                out.append(Difference(name, want, None, REMOVE))
        elif want != have:
            out.append(Difference(name, want, have, NOT_EQUAL))
    return tuple(out)


def changed_fields(differences: Iterable[Difference]) -> set[str]:
    """The top-level config fields the differences touch (``tags.env`` -> ``tags``)."""
    return {d.path.split(".", 1)[0] for d in differences}
