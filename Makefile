# `make up` runs Allotment; `make test` runs every check. Both create .venv when missing
# and reinstall only when pyproject.toml changed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINT_PATHS := $(wildcard src tests bench)

CORE := src/allotment/scheduler
CORE_SOURCES := $(filter-out $(CORE)/__init__.py,$(wildcard $(CORE)/*.py))
CORE_IMPORTS := $(wildcard src/allotment/domain/*.py)
CORE_STAMP := $(CORE)/.compiled

.PHONY: up test venv compiled

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

# The scheduling core compiled with mypyc into extension modules beside its sources (the
# same decisions, faster); they run while newer than every source they were built from,
# the core's and the domain's (see src/allotment/scheduler/__init__.py). Without a C
# compiler the sources run as they are.
compiled: $(CORE_STAMP)

$(CORE_STAMP): $(CORE_SOURCES) $(CORE_IMPORTS) $(STAMP)
	rm -f $(CORE)/*.so src/*__mypyc*.so
	mkdir -p src/build
	if (cd src && $(abspath $(BIN))/mypyc $(patsubst src/%,%,$(CORE_SOURCES)) > build/compile-core.log 2>&1); \
	then touch $(CORE)/*.so src/*__mypyc*.so; echo "compiled the scheduling core"; \
	else tail -5 src/build/compile-core.log; rm -f $(CORE)/*.so src/*__mypyc*.so; \
	echo "note: the scheduling core was not compiled; its sources run as they are"; fi
	touch $@

# The main job: server, control loop, local executor and dashboard on this machine, with
# the one-workstation example cluster (two virtual GPUs unless NVML finds real ones).
up: $(STAMP) $(CORE_STAMP)
	$(BIN)/allot up -f examples/cluster-local.yaml

test: $(STAMP) $(CORE_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy --strict src/allotment/domain src/allotment/scheduler src/allotment/sim src/allotment/cli src/allotment/executors src/allotment/store src/allotment/control src/allotment/api src/allotment/web src/allotment/telemetry src/allotment/upkeep src/allotment/accounting src/allotment/client.py src/allotment/clientconfig.py src/allotment/server.py src/allotment/host.py src/allotment/api_processes.py
	$(BIN)/python -m pytest; status=$$?; if [ $$status -eq 5 ]; then exit 0; fi; exit $$status
