# The two commands: `make run` (the service, embedded defaults) and `make test` (everything CI runs).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint lock test-unit test-integration test-e2e test-chaos install clean

# Extra pip options, e.g. PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu' on a machine
# whose pip does not already find the CPU torch wheel (constraints.txt pins torch==2.13.0+cpu, which PyPI
# does not have: pip then fails instead of fetching the CUDA build).
PIP_ARGS ?=

# Re-install when pyproject.toml or constraints.txt changes. pip, not uv: pip finds the CPU torch wheel
# on this machine. Every version comes from constraints.txt (the lock), so two installs are the same.
$(STAMP): pyproject.toml client/pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c constraints.txt --upgrade pip
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -c constraints.txt -e ./client -e '.[dev]' -e examples/
	@touch $(STAMP)

# Regenerate constraints.txt from the venv: run it after changing or adding a dependency in
# pyproject.toml (or to take newer versions of the indirect ones), and commit both files together.
# It installs without the old lock first, so the new pins win, then freezes what is installed.
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(PIP_ARGS) -e ./client -e '.[dev]' -e examples/
	{ sed -n '/^#/p' constraints.txt 2>/dev/null; $(BIN)/python -m pip freeze --all --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	@touch $(STAMP)

# Also Debian's chromium for the dashboard's browser tests (apt-get as root; quiet when it is there).
install: $(STAMP)
	bash scripts/ensure-chromium.sh

run: $(STAMP)
	exec $(BIN)/orchestrator serve

# Lint and format (ruff, configured in pyproject.toml) and the import contracts of the layering
# (import-linter, [tool.importlinter] in pyproject.toml). `ruff format .` fixes what the second one finds.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# The suites on Ray stop after a few failures (--maxfail): when the cluster itself cannot run jobs, every
# test fails only after its own wait, and the whole run would pass CI's time limit before printing a single
# traceback. Each suite's header prints the machine's free disk, memory and load (tests/conftest.py).
# Lint first, then the unit tests (no Ray cluster; on both cores), integration (one local Ray cluster for the session, SQLite and
# PostgreSQL), then the chaos
# scenarios and the end-to-end test, which start the service themselves (with its own local Ray cluster)
# and so must not share the machine with another cluster.
test: $(STAMP)
	$(MAKE) --no-print-directory lint
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-chromium.sh
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/unit -v -n 2 --timeout 900 --durations 15
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/security -v -n 2 --timeout 900
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/integration -v --timeout 900 --maxfail 4 --durations 30
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/chaos -v --timeout 600 --maxfail 3
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/e2e -v --timeout 900 --maxfail 2

# kill -9 of workers, drivers, the Ray head and the control plane under running jobs (tests/chaos).
test-chaos: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/chaos -v --timeout 600

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

clean:
	rm -rf $(VENV) var
