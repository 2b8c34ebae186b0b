# The two commands: `make book` and `make test`. Both create .venv if missing.
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
MACHINE ?= hetero-4
BACKEND ?= model
BUDGET  ?= quick
SEED    ?= 0

.PHONY: help venv book test lint clean

help:
	@echo "make book   execute every notebook (MACHINE=$(MACHINE) BACKEND=$(BACKEND) BUDGET=$(BUDGET)) and build _build/html"
	@echo "make test   unit tests plus a smoke run of every notebook"
	@echo "make lint   ruff over lib and tests"
	@echo "make clean  remove build output (keeps .venv)"

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
