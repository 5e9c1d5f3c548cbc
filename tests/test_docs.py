"""The lifecycle diagram, its table of edges and events, and the README's list of events match the
edge table in code."""

from __future__ import annotations

import re
from pathlib import Path

from tether.ledger.lifecycle import EDGES
from tether.ledger.status import JobStatus

DOC = Path(__file__).resolve().parent.parent / "docs" / "lifecycle.md"


def test_lifecycle_diagram_lists_exactly_the_transitions_in_code():
    edges = set(re.findall(r"^\s+(\w+) --> (\w+) : (\w+)$", DOC.read_text(), re.M))
    in_code = {(edge.source.value, edge.target.value, name) for name, edge in EDGES.items()}
    assert edges == in_code


def test_the_lifecycle_table_names_each_edges_event_as_the_code_does():
    rows = dict(re.findall(r"^\| (\w+) \| `(\w+)` \|", DOC.read_text(), re.M))
    assert rows == {name: edge.event for name, edge in EDGES.items()}


def test_the_readme_lists_every_edges_event():
    readme = (DOC.parent.parent / "README.md").read_text()
    listed = re.search(r"\*\*Lifecycle events\*\*(.*?)\n\n", readme, re.S)
    assert listed is not None
    missing = [edge.event for edge in EDGES.values() if f"`{edge.event}`" not in listed.group(1)]
    assert not missing, f"the README's list of lifecycle events lacks {missing}"


def test_every_status_is_documented():
    text = DOC.read_text()
    assert all(f"`{s.value}`" in text or f" {s.value} " in text for s in JobStatus)


def test_every_image_the_readme_shows_is_committed():
    readme = DOC.parent.parent / "README.md"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", readme.read_text())
    assert images, "the README shows no screenshot"
    missing = [i for i in images if not (readme.parent / i).is_file()]
    assert not missing, f"README shows images that are not in the repository: {missing}"
