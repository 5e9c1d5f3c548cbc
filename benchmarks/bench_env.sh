#!/usr/bin/env bash
# The issue-7 benchmark environment: .bench/venv-anchors (gitignored) with the anchors (huey,
# persist-queue, litequeue; python-ulid for the 1,000,000-row fill) from PyPI and this checkout's tether installed editable.
#   bash benchmarks/bench_env.sh              # create or update the venv
#   bash benchmarks/bench_env.sh run [ARGS]   # ... then run anchors.py ARGS and pickup.py
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.bench/venv-anchors"
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e "$repo" "huey>=2.5" "persist-queue>=1.0" "litequeue>=0.9" "python-ulid>=2.7"
"$venv/bin/python" - <<'PY'
import importlib.metadata as m
print("anchors:", ", ".join(f"{p} {m.version(p)}" for p in ("huey", "persist-queue", "litequeue", "tether")))
PY
if [ "${1:-}" = "run" ]; then
    shift
    cd "$repo/benchmarks"
    "$venv/bin/python" anchors.py "$@"
    "$venv/bin/python" pickup.py
fi
