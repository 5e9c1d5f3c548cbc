"""Lazy re-exports for a package's ``__init__`` (PEP 562): the package names what it offers and
the submodule each name lives in, and a submodule is imported when one of its names is first
used, so importing the package stays cheap (``tether --help`` loads no ledger and no SQLAlchemy)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``where`` maps each name to its submodule
    (relative, e.g. ``".loop"``)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # once imported, a plain attribute
        return value

    return __getattr__
