"""Ignore rules: drift the operator chose not to be told about as drift, by rule.

The rules live in ``<data root>/.tether/drift-ignore``, one a line (``#`` starts a comment):

- a path glob for files (``tmp/*.json``; ``*`` also crosses ``/``): every finding on a matching
  path;
- ``aws:<target glob>:<field>`` for AWS resources (``aws:s3_bucket:*:tags.LastModifiedBy``): the
  target glob matches ``<type>:<region>:<id>``, the field a differing field's path (``*``: the
  whole resource). A finding whose every difference an AWS rule covers is ignored; one with other
  differences stays reported, the covered ones left out of it.

An ignored finding is not dropped: the report lists it under ``ignored`` with the rule that
matched and counts it, and it never makes the exit code drift.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path

from ..jobtypes.aws.resource import RESOURCES
from ..jobtypes.datafiles.paths import INTERNAL_DIR
from .drift import DRIFT, Finding

FILE_NAME = "drift-ignore"


@dataclass(frozen=True)
class Rule:
    text: str
    target: str  # glob over a finding's path (for AWS: ``<type>:<region>:<id>``)
    field: str | None  # an AWS rule's field glob; None: a file rule

    def covers(self, finding: Finding) -> bool:
        """Whether the rule ignores the whole finding."""
        if not fnmatchcase(finding.path, self.target):
            return False
        if self.field is None:
            return not _is_aws(finding)
        return (
            self.field == "*"
            or bool(finding.differences)
            and all(fnmatchcase(d.path, self.field) for d in finding.differences)
        )


def path_of(root: Path) -> Path:
    return root / INTERNAL_DIR / FILE_NAME


def load(root: Path) -> list[Rule]:
    """The rules of the data root (none if it has no file)."""
    try:
        text = path_of(root).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return parse(text)


def parse(text: str) -> list[Rule]:
    rules = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("aws:"):
            target, _, field = line.removeprefix("aws:").rpartition(":")
            rules.append(Rule(line, target or "*", field or "*"))
        else:
            rules.append(Rule(line, line, None))
    return rules


def split(findings: list[Finding], rules: list[Rule]) -> tuple[list[Finding], list[tuple[Finding, str]]]:
    """``findings`` as (reported, ignored with the rule that matched). Only drift is ignored:
    a target that could not be read stays reported."""
    if not rules:
        return findings, []
    reported, ignored = [], []
    for finding in findings:
        rule = next((r for r in rules if finding.status in DRIFT and r.covers(finding)), None)
        if rule is not None:
            ignored.append((finding, rule.text))
            continue
        reported.append(_without_ignored_fields(finding, rules))
    return reported, ignored


def _without_ignored_fields(finding: Finding, rules: list[Rule]) -> Finding:
    """A finding with the differences an AWS rule covers left out (the others keep it drift)."""
    fields = [r for r in rules if r.field is not None and fnmatchcase(finding.path, r.target)]
    if not fields or not finding.differences:
        return finding
    kept = tuple(d for d in finding.differences if not any(fnmatchcase(d.path, r.field or "") for r in fields))
    return finding if len(kept) == len(finding.differences) else replace(finding, differences=kept)


def _is_aws(finding: Finding) -> bool:
    return finding.job_type == "sync_aws" or finding.path.partition(":")[0] in RESOURCES
