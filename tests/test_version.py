"""``tether --version`` and ``tether.__version__`` say the installed package's version."""

from __future__ import annotations

from importlib import metadata

import pytest

import tether
from clikit import run_split


def test_version_is_the_installed_packages(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    installed = metadata.version("tether")
    assert tether.__version__ == installed
    code, out, err = run_split(monkeypatch, capsys, "--version")
    assert (code, out.strip(), err) == (0, f"tether {installed}", "")
