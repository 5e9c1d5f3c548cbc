"""Sizes a reader can hold in their head: no module in ``src/tether`` over 400 lines, no function
(methods and nested functions included, each counted on its own) over 60 lines. A failure names
every offender with its size, so a split can start from the list."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tether"

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized(root: Path) -> list[str]:
    """Every module under ``root`` over ``MAX_MODULE_LINES`` lines and every function over
    ``MAX_FUNCTION_LINES`` (from its ``def`` line to its last line, decorators left out), as
    ``file:line name N lines``, paths from the directory above ``root``'s parent (the repository
    for ``src/tether``), in file order."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(root.parents[1]).as_posix()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where}:1 (module) {lines} lines")
        functions = [
            node
            for node in ast.walk(ast.parse(text, str(path)))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for node in sorted(functions, key=lambda n: n.lineno):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name} {size} lines")
    return found


def test_no_module_or_function_is_over_its_size():
    offenders = oversized(SRC)
    assert not offenders, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function "
        "(split it by concept):\n" + "\n".join(offenders)
    )


def _module(lines: int) -> str:
    return "".join(f"x{n} = {n}\n" for n in range(lines))


def _function(name: str, lines: int) -> str:
    return f"def {name}():\n" + "".join(f"    y{n} = {n}\n" for n in range(lines - 1))


def test_a_401_line_module_fails_and_a_400_line_one_passes(tmp_path):
    root = tmp_path / "src" / "tether"
    (root / "ledger").mkdir(parents=True)
    (root / "ledger" / "fits.py").write_text(_module(400))
    assert oversized(root) == []
    (root / "ledger" / "big.py").write_text(_module(401))
    assert oversized(root) == ["src/tether/ledger/big.py:1 (module) 401 lines"]


def test_a_61_line_function_fails_wherever_it_is_nested(tmp_path):
    root = tmp_path / "src" / "tether"
    root.mkdir(parents=True)
    body = (
        _function("fits", 60)
        + "class Worker:\n"
        + "".join("    " + line + "\n" for line in (_function("run", 61) + _function("inner", 61)).splitlines())
    )
    (root / "worker.py").write_text(body)
    # ``inner`` (61 lines) sits after ``run`` in the class, not inside it: both are reported.
    assert oversized(root) == ["src/tether/worker.py:62 run 61 lines", "src/tether/worker.py:123 inner 61 lines"]
    nested = "def outer():\n" + "".join("    " + line + "\n" for line in _function("inner", 61).splitlines())
    (root / "worker.py").write_text(nested)
    assert oversized(root) == ["src/tether/worker.py:1 outer 62 lines", "src/tether/worker.py:2 inner 61 lines"]
