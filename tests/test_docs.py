"""The lifecycle diagram in docs/ matches the transition table in code."""

from __future__ import annotations

import re
from pathlib import Path

from tether.ledger.status import TRANSITIONS, JobStatus

DOC = Path(__file__).resolve().parent.parent / "docs" / "lifecycle.md"


def test_lifecycle_diagram_lists_exactly_the_transitions_in_code():
    edges = set(re.findall(r"^\s+(\w+) --> (\w+) : (\w+)$", DOC.read_text(), re.M))
    in_code = {(a.value, b.value, name) for name, (a, b) in TRANSITIONS.items()}
    assert edges == in_code


def test_every_status_is_documented():
    text = DOC.read_text()
    assert all(f"`{s.value}`" in text or f" {s.value} " in text for s in JobStatus)


def test_every_image_the_readme_shows_is_committed():
    readme = DOC.parent.parent / "README.md"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", readme.read_text())
    assert images, "the README shows no screenshot"
    missing = [i for i in images if not (readme.parent / i).is_file()]
    assert not missing, f"README shows images that are not in the repository: {missing}"
