"""The top-level package's exports, imported lazily (PEP 562): the names it offers are imported
from their submodules when first used, so ``import tether`` stays cheap (the command line imports the
package, and ``tether --help`` loads no ledger and no SQLAlchemy).

The package lists its names once, as the ``from ... import`` statements of its
``if TYPE_CHECKING:`` block, which type checkers read; ``lazy`` reads the same statements from
the package's source, so there is no second list to keep in step.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: each name its
    ``if TYPE_CHECKING:`` block imports is imported from the same module on first use;
    ``__all__`` (``from package import *``) is those names."""
    module = sys.modules[package]
    namespace = module.__dict__
    # Read on first use: importing the package parses nothing.
    where = functools.cache(lambda: _type_checking_imports(str(module.__file__)))

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            return sorted(where())
        if name not in where():
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        source, original = where()[name]
        value = getattr(importlib.import_module(source, package), original)
        namespace[name] = value  # once imported, a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where()})

    return __getattr__, __dir__


def _type_checking_imports(path: str) -> dict[str, tuple[str, str]]:
    """Each name that a top-level ``if TYPE_CHECKING:`` block of the module at ``path`` imports
    with ``from ... import``: the module it comes from (relative, as written) and its name there."""
    import ast

    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    where: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    source = "." * statement.level + (statement.module or "")
                    where.update({a.asname or a.name: (source, a.name) for a in statement.names})
    return where
