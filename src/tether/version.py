"""tether's version, read from the installed package's metadata: the one place it is written is
pyproject.toml, so ``tether --version``, ``tether.__version__`` and the wheel always agree."""

from __future__ import annotations

from functools import cache
from importlib import metadata

DISTRIBUTION = "tether"


@cache
def installed() -> str:
    """The version of the installed ``tether`` distribution; "unknown" when tether runs from a
    source tree that was never installed (no metadata to read). Read once a process, from the
    metadata's headers alone: ``metadata.version`` parses the whole file, README included, with
    the email parser, milliseconds of every worker's start."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
    headers = (dist.read_text("METADATA") or "").partition("\n\n")[0]
    for line in headers.splitlines():
        if line.startswith("Version:"):
            return line.removeprefix("Version:").strip()
    return "unknown"
