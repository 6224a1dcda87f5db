# The two commands: `make run` (the service, embedded defaults) and `make test` (everything CI runs).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-unit test-integration test-e2e test-chaos install clean

# Re-install when pyproject.toml changes. pip, not uv: pip finds the CPU torch wheel on this machine.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' -e examples/
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	exec $(BIN)/orchestrator serve

# Unit tests (no Ray; on both cores), integration (one local Ray cluster for the session, SQLite and
# PostgreSQL), then the chaos
# scenarios and the end-to-end test, which start the service themselves (with its own local Ray cluster)
# and so must not share the machine with another cluster.
test: $(STAMP)
	bash scripts/ensure-postgres.sh
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/unit -v -n 2 --timeout 900 --durations 15
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/security -v -n 2 --timeout 900
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/integration -v --timeout 900 --durations 30
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/chaos -v --timeout 600
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/e2e -v --timeout 900

# kill -9 of workers, drivers, the Ray head and the control plane under running jobs (tests/chaos).
test-chaos: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest tests/chaos -v --timeout 600

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

clean:
	rm -rf $(VENV) var
