PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo lint test bench bench-anchors bench-reconcile clean

$(STAMP): pyproject.toml setup.py src/tether/jobtypes/datafiles/_stamps.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tether.demo

# Issue 21: format, lint and type checks; each finding is printed as file:line:column.
LINT_PATHS := src tests benchmarks examples

lint: $(STAMP)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/ruff check --output-format concise $(LINT_PATHS)
	$(BIN)/mypy

# The tests start several hundred tether processes; where PYTHONDONTWRITEBYTECODE is set (as on
# the CI machines) each would compile tether's sources again: compile them once, up front.
test: lint
	$(BIN)/python -m compileall -q src > /dev/null
	$(BIN)/pytest -q -n auto

bench: $(STAMP)
	$(BIN)/python benchmarks/core.py

# Issue 7: tether next to huey, persist-queue and litequeue, in their own venv (.bench/venv-anchors).
bench-anchors:
	bash benchmarks/bench_env.sh run

# Issue 3: reconcile throughput next to bare stat / read+hash, and peak memory at 100k vs 1M jobs.
bench-reconcile: $(STAMP)
	$(BIN)/python benchmarks/reconcile.py

clean:
	rm -rf $(VENV) demo-run .pytest_cache .mypy_cache .ruff_cache
