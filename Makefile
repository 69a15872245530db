# `make up` runs Allotment; `make test` runs every check. Both create .venv when missing
# and reinstall only when pyproject.toml changed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINT_PATHS := $(wildcard src tests bench)

.PHONY: up test venv

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

# The main job: server, control loop, local executor and dashboard on this machine, with
# the one-workstation example cluster (two virtual GPUs unless NVML finds real ones).
up: $(STAMP)
	$(BIN)/allot up -f examples/cluster-local.yaml

test: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy --strict src/allotment/domain src/allotment/scheduler src/allotment/sim src/allotment/cli src/allotment/executors src/allotment/store src/allotment/control src/allotment/api src/allotment/web src/allotment/telemetry src/allotment/upkeep src/allotment/accounting src/allotment/client.py src/allotment/clientconfig.py src/allotment/server.py src/allotment/host.py src/allotment/api_processes.py
	$(BIN)/python -m pytest; status=$$?; if [ $$status -eq 5 ]; then exit 0; fi; exit $$status
