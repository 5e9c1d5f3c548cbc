"""The docs hold what the code does: the lifecycle diagram, its table of edges and events, and the
README's list of events match the edge table in code; the README's images are committed; every
relative link between the Markdown files resolves."""

from __future__ import annotations

import re
from pathlib import Path

from tether.ledger.lifecycle import EDGES
from tether.ledger.status import JobStatus

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "lifecycle.md"


def test_lifecycle_diagram_lists_exactly_the_transitions_in_code():
    edges = set(re.findall(r"^\s+(\w+) --> (\w+) : (\w+)$", DOC.read_text(), re.M))
    in_code = {(edge.source.value, edge.target.value, name) for name, edge in EDGES.items()}
    assert edges == in_code


def test_the_lifecycle_table_names_each_edges_event_as_the_code_does():
    rows = dict(re.findall(r"^\| (\w+) \| `(\w+)` \|", DOC.read_text(), re.M))
    assert rows == {name: edge.event for name, edge in EDGES.items()}


def test_the_attempts_table_names_the_row_each_edge_writes_as_the_code_does():
    section = DOC.read_text().split("## Attempts", 1)[1]
    rows = dict(re.findall(r"^\| `(\w+)` \| `(\w+)`", section, re.M))
    assert rows == {name: edge.attempt.value for name, edge in EDGES.items() if edge.attempt is not None}


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


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(repo: Path) -> list[str]:
    """Relative links in the repository's Markdown files whose file, or heading, is not there."""
    docs = [repo / "README.md", *sorted((repo / "docs").glob("*.md")), *sorted((repo / "benchmarks").glob("*.md"))]
    broken = []
    for doc in docs:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target, anchor in re.findall(r"\]\(([^)#\s:]*)(?:#([^)\s]+))?\)", text):
            linked = (doc.parent / target).resolve() if target else doc
            if not linked.exists():
                broken.append(f"{doc.relative_to(repo)}: {target} does not exist")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{doc.relative_to(repo)}: {target or doc.name}#{anchor} names no heading")
    return broken


def test_every_relative_link_in_the_docs_resolves():
    assert not broken_links(DOC.parent.parent), "\n".join(broken_links(DOC.parent.parent))


def test_a_link_to_a_missing_heading_or_file_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "HISTORY.md").write_text("# History\n\n## `limits.py`: cost (row 1)\n")
    (tmp_path / "README.md").write_text(
        "[ok](benchmarks/HISTORY.md#limitspy-cost-row-1) [gone](benchmarks/HISTORY.md#limitspy)"
        " [missing](docs/design.md) [web](https://example.com/x#y)\n"
    )
    assert broken_links(tmp_path) == [
        "README.md: benchmarks/HISTORY.md#limitspy names no heading",
        "README.md: docs/design.md does not exist",
    ]


def test_the_readme_s_layer_table_names_every_module():
    # A newcomer finds each concept in the table: a module is named by its path, by its file name
    # in the row of its package, or (a command's module) by the command it is named for.
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Contributing: the layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    commands = [line for line in readme.splitlines() if line.startswith("| `tether ")]
    src = ROOT / "src" / "tether"
    unnamed = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        package = rel.split("/")[0] + "/"
        if path.name in ("__init__.py", "__main__.py") or f"`{rel}`" in table:
            continue
        if "/" in rel and any(f"`{package}" in row and f"`{path.name}`" in row for row in rows):
            continue
        command = path.stem.replace("_", "-")
        if package == "cli/" and any(re.search(rf"`(tether )?{command}\b", row) for row in commands):
            continue
        unnamed.append(rel)
    assert unnamed == [], f"modules the README's layer table does not name: {unnamed}"
