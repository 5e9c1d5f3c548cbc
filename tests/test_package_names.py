"""The top-level package's names: each is imported lazily from the module its
``if TYPE_CHECKING:`` block names, and that block is the package's one list of them."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import tether


def _listed() -> dict[str, str]:
    tree = ast.parse(Path(tether.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {
        a.asname or a.name: "." * s.level + str(s.module)
        for s in block.body
        if isinstance(s, ast.ImportFrom)
        for a in s.names
    }


def test_every_listed_name_is_the_object_in_its_module_and_in_all() -> None:
    listed = _listed()
    assert "Coordinator" in listed and "JobStatus" in listed
    assert tether.__all__ == sorted(listed)
    for name, module in listed.items():
        assert getattr(tether, name) is getattr(importlib.import_module(module, "tether"), name), name
    assert set(listed) <= set(dir(tether))


def test_star_import_gives_every_listed_name_without_importing_sqlalchemy_first() -> None:
    code = (
        "import sys, tether; before = 'sqlalchemy' in sys.modules; ns = {}; exec('from tether import *', ns);"
        " print(before, sorted(k for k in ns if not k.startswith('__')) == tether.__all__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout == "False True\n", done.stderr[-2000:]
