# Two commands set everything up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; set TORCH="torch" (or a CUDA build spec) on a GPU machine.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo lint test test-gpu bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# ROOT: where the demo's sweep and its dashboard go (`make demo ROOT=/tmp/rla-runs`)
ROOT ?= rla-runs
demo: $(STAMP)
	$(VENV)/bin/rla-sweep launch sweeps/smoke.yaml --root $(ROOT)
	$(VENV)/bin/rla-sweep dashboard smoke --root $(ROOT)

# The linter and the type check run first: they take a minute, the tests many.
# mypy's files and per-module settings are in pyproject.toml ([tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

# The 20 slowest tests are listed at the end: the suite is meant to stay near 10 minutes on a 2-core machine.
# Two workers, each taking whole test files (a file's module fixtures, e.g. its MLflow server, start once): most
# of the slow tests wait on Ray, MLflow and subprocesses, so two overlap (12 min against 15.5 on two cores).
test: $(STAMP) lint
	$(PY) -m pytest -q -x -n 2 --dist loadfile --durations=20 tests

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests

clean:
	rm -rf $(VENV) rla-runs .pytest_cache .mypy_cache .ruff_cache
