"""tether's version, read from the installed package's metadata: the one place it is written is
pyproject.toml, so ``tether --version``, ``tether.__version__`` and the wheel always agree."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "tether"


def installed() -> str:
    """The version of the installed ``tether`` distribution; "unknown" when tether runs from a
    source tree that was never installed (no metadata to read)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
