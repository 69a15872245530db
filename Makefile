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

# The server does not exist yet: for now the main job is a policy comparison on the
# example trace.
up: $(STAMP)
	$(BIN)/allot sim examples/trace.csv -f examples/cluster.yaml --policy fifo-isolated --policy default

test: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy --strict src/allotment/domain src/allotment/scheduler src/allotment/sim src/allotment/cli src/allotment/executors src/allotment/store src/allotment/control src/allotment/api src/allotment/web src/allotment/client.py src/allotment/clientconfig.py src/allotment/server.py
	$(BIN)/python -m pytest; status=$$?; if [ $$status -eq 5 ]; then exit 0; fi; exit $$status
