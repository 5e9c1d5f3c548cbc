"""Each module of the data-files package imports first, in a fresh interpreter.

The file probes answer in ``jobtypes.base``'s ``Check``, and ``jobtypes/__init__`` imports the
probes back (through ``create_file``). So the package lives inside ``jobtypes``, whose
``__init__`` always runs before any of its modules; placed beside ``jobtypes`` instead, a process
whose first import is a probe module would find it half-initialized. The layer test sees no
circle there (``jobtypes.base`` imports none of it), so this test keeps the placement honest.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tether" / "jobtypes" / "datafiles"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")

# One interpreter for all of them: before each import every tether module is forgotten, so each
# is imported first (what is cached of pydantic or SQLAlchemy plays no part in the order).
_IMPORT_EACH_FIRST = """
import importlib, sys, traceback
failed = 0
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "tether" or m.startswith("tether.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed += 1
        print(f"importing {name} first fails:", traceback.format_exc(), sep="\\n")
sys.exit(failed)
"""


def test_every_data_files_module_imports_first_in_a_fresh_interpreter():
    assert {"content", "durable", "effects", "existence", "nofollow", "paths"} <= set(MODULES)
    names = [f"tether.jobtypes.datafiles.{m}" for m in MODULES]
    run = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH_FIRST, *names], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
