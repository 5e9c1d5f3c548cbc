"""What a job acts on: a data file, an AWS resource, an extraction's output file.

A target is a kind and an identity. Rendered (``file:notes/a.json``, ``aws:s3_bucket:eu-west-1:logs``)
it is the job's ``ordering_key`` in the ledger: jobs with one target take effect in enqueue order,
and the reconciler checks each target against its latest completed job. This module is the only
place that renders or parses that form.
"""

from __future__ import annotations

from typing import NamedTuple

FILE = "file"
"""A path under the data root."""

AWS = "aws"
"""An AWS resource: ``<resource type>:<region>:<resource id>``."""

_SEPARATOR = ":"


class Target(NamedTuple):
    kind: str
    identity: str

    @property
    def key(self) -> str:
        """The rendered form, stored as the job's ``ordering_key``."""
        return f"{self.kind}{_SEPARATOR}{self.identity}"

    def __str__(self) -> str:
        return self.key

    @property
    def display(self) -> str:
        """How an operator names it: its identity (a file by its path), the kind being plain from
        the job's type."""
        return self.identity

    @classmethod
    def file(cls, rel: str) -> Target:
        """The target of the data file ``rel`` (canonical, relative to the root)."""
        return cls(FILE, rel)

    @classmethod
    def parse(cls, key: str) -> Target:
        """The target an ``ordering_key`` renders; a key without a kind (an application's own
        ordering key) is a target of kind ``""``."""
        kind, sep, identity = key.partition(_SEPARATOR)
        if not sep or not identity:
            return cls("", key)
        return cls(kind, identity)


def file_key(rel: str) -> str:
    """The ordering key of the data file ``rel`` (``file:notes/a.json``): every job touching one
    path shares it. The one way to spell a file's key; a bare path given where a target is asked
    for names a file."""
    return Target.file(rel).key


def display(key: str) -> str:
    """``Target.parse(key).display``."""
    return Target.parse(key).display


def named(name: str) -> list[str]:
    """The ordering keys an operator's name for a target may mean, most likely first: a key as
    stored (``file:notes/a.json``, ``aws:s3_bucket:eu-west-1:logs``) means itself; a target as
    reconcile prints it means a data path, or an AWS resource without its kind; last, an
    application's own ordering key, as given."""
    kind, sep, _ = name.partition(_SEPARATOR)
    if sep and kind in (FILE, AWS):
        return [name]
    keys = [Target.file(name).key]
    if sep:
        keys.append(Target(AWS, name).key)
    return [*keys, name]
