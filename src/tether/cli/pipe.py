"""A closed stdout (``tether status | head -1``) ends the output quietly: the command runs to
its end and keeps its own exit code, with nothing on stderr."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class QuietStdout:
    """Wraps ``sys.stdout``: on the first broken pipe, points file descriptor 1 at /dev/null so
    every later write (and the interpreter's last flush) goes nowhere instead of raising."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._discard()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._discard()

    def _discard(self) -> None:
        self.closed_by_reader = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, buffer...
        return getattr(self._stream, name)


def quiet_closed_stdout() -> None:
    """Install the wrapper (once) for the length of the process."""
    if not isinstance(sys.stdout, QuietStdout) and sys.stdout is not None:
        sys.stdout = QuietStdout(sys.stdout)
