"""The command line run in the test's process, through its console entry point."""

from __future__ import annotations

import sys

import pytest

from tether.cli import main


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``tether ARGS`` through the console entry point: exit code and stdout + stderr."""
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(sys, "argv", ["tether", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    captured = capsys.readouterr()
    return code, captured.out + captured.err
