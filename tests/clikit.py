"""The command line run in the test's process, through its console entry point."""

from __future__ import annotations

import sys

import pytest

from tether.cli import main


def run_split(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``tether ARGS`` through the console entry point: exit code, stdout, stderr. The code is
    Python's for the ``SystemExit`` raised: None is 0, a message (not a number) is 1."""
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(sys, "argv", ["tether", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``tether ARGS`` through the console entry point: exit code and stdout + stderr."""
    code, out, err = run_split(monkeypatch, capsys, *args)
    return code, out + err
