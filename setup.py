"""tether's one C module, declared here: pyproject.toml declares an extension only as a
setuptools experiment.

The content check's stats and comparisons of fingerprints (src/tether/jobtypes/datafiles/_stamps.c,
fingerprint.py says why). Optional: where it cannot be built (no C compiler), the check makes them
in Python, slower, with the same verdicts.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tether.jobtypes.datafiles._stamps",
            ["src/tether/jobtypes/datafiles/_stamps.c"],
            optional=True,
        )
    ]
)
