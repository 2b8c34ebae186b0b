# The two commands: `make book` and `make test`. Both create .venv if missing.
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
MACHINE ?= hetero-4
BACKEND ?= model
BUDGET  ?= quick
SEED    ?= 0

.PHONY: help venv book test lint clean gpu-check

help:
	@echo "make book   execute every notebook (MACHINE=$(MACHINE) BACKEND=$(BACKEND) BUDGET=$(BUDGET)) and build _build/html"
	@echo "make test   unit tests plus a smoke run of every notebook"
	@echo "make lint   ruff over lib and tests"
	@echo "make clean  remove build output (keeps .venv)"
	@echo "make gpu-check  on a GPU server: GPU tests and a timed sweep (JSON in _build)"

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,book,gpu,llm]'
	@touch $(STAMP)

venv: $(STAMP)

book: $(STAMP)
	$(BIN)/gpuhive book --machine $(MACHINE) --backend $(BACKEND) --budget $(BUDGET) --seed $(SEED)

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check lib tests

clean:
	rm -rf _build figures/*/

# On a machine with a GPU: the GPU tests, then a timed sweep of every kind on one
# and on all devices, written to _build/gpu-check.json (a few minutes at most).
gpu-check: $(STAMP)
	timeout 300 sh -c '$(BIN)/python -m pytest -q -m gpu && $(BIN)/gpuhive sweep --machine nvml --backend cuda --out _build/gpu-check.json'
