"""The import graph only goes down: a lower layer never imports a higher one, and there is no
circle (imports inside functions count; ``if TYPE_CHECKING:`` imports, which never run, do not)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tether"

# Lowest first. A module may import its own layer or any lower one. An entry names a module or a
# package (all of it), dotted for one module inside a package; the longest entry that fits counts.
LAYERS: list[tuple[str, ...]] = [
    # what everything uses: settings, time, errors (and which database errors are faults), statuses,
    # ids, plain records, the limits a job must keep
    (
        "config",
        "clock",
        "errors",
        "events",
        "tracing",
        "exports",
        "version",
        "ledger.status",
        "ledger.lifecycle",
        "ledger.attempts",
        "ledger.ids",
        "ledger.record",
        "ledger.faults",
        "ledger.limits",
    ),
    # what a job is and what its handler may touch: the data root (jobtypes.datafiles), targets,
    # the handler context
    ("jobtypes",),
    # the table, its engine and statements, enqueue/claim/transition, wake-ups
    ("ledger",),
    # running jobs: claiming, running, recording outcomes, supervision, periodic jobs, retry backoff
    ("worker",),
    # reading the ledger and the world: reconcile, the operator's questions
    ("reconcile", "observe"),
    # what applications hold
    ("coordinator", "opening", "transaction"),
    ("store", "aio"),
    # the edges: the command line, the web pages, the agents' tool server, the sample application, the
    # package's front door, the pytest plugin
    ("demo.aws",),
    ("cli", "ui", "toolserver", "demo", "__main__", "__init__", "testing"),
]


def _layer(module: str) -> int:
    parts = module.split(".")
    for size in range(len(parts), 0, -1):
        prefix = ".".join(parts[:size])
        for n, names in enumerate(LAYERS):
            if prefix in names:
                return n
    raise AssertionError(f"tether.{module} is in no layer of tests/test_layers.py: add it to one")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _runtime_imports(path: Path) -> set[str]:
    """tether modules ``path`` imports when it runs (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.startswith("tether"):
                target = node.module.removeprefix("tether").lstrip(".")
            else:
                continue
            names = [f"{target}.{a.name}" if target else a.name for a in node.names]
            found.update(n for n in names if _exists(n)) or found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name.removeprefix("tether.") for a in node.names if a.name.startswith("tether."))
    return {m for m in found if m}


def _exists(module: str) -> bool:
    path = SRC.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _runtime_imports(p) for p in sorted(SRC.rglob("*.py"))}


def test_every_module_imports_only_its_own_layer_or_lower_ones():
    upward = [
        f"tether.{module} (layer {_layer(module)}) imports tether.{target} (layer {_layer(target)})"
        for module, targets in _graph().items()
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_the_import_graph_has_no_circle():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            target = target if target in graph else target.rsplit(".", 1)[0]
            if state.get(target) == 1 and target != module:
                cycle = path[path.index(target) :] + [target] if target in path else [module, target]
                pytest.fail("import circle: " + " -> ".join(f"tether.{m}" for m in cycle))
            if target in graph and target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])


def test_the_layer_test_sees_an_upward_import(tmp_path, monkeypatch):
    # The test itself can fail: a lower module importing a higher one is caught.
    fake = tmp_path / "tether"
    (fake / "jobtypes").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "coordinator.py").write_text("")
    (fake / "jobtypes" / "__init__.py").write_text("")
    (fake / "jobtypes" / "base.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..store import X\n"
        "from ..coordinator import Coordinator\n"
    )
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    assert _runtime_imports(fake / "jobtypes" / "base.py") == {"coordinator"}
    with pytest.raises(AssertionError, match="tether.jobtypes.base .layer 1. imports tether.coordinator"):
        test_every_module_imports_only_its_own_layer_or_lower_ones()


def test_a_dotted_layer_entry_holds_one_module_of_a_package_below_the_rest(tmp_path, monkeypatch):
    # "demo.aws" sits below "demo": the AWS part of the demo may not import the demo that drives it.
    fake = tmp_path / "tether"
    (fake / "demo").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "demo" / "__init__.py").write_text("")
    (fake / "demo" / "app.py").write_text("from . import aws\n")
    (fake / "demo" / "aws.py").write_text("from .app import main\n")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    with pytest.raises(AssertionError, match=r"tether.demo.aws .layer 7. imports tether.demo.app .layer 8."):
        test_every_module_imports_only_its_own_layer_or_lower_ones()
