# The two commands: `make book` and `make test`. Both create .venv if missing.
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
MACHINE ?= hetero-4
BACKEND ?= model
BUDGET  ?= quick
SEED    ?= 0

.PHONY: help install venv book test lint audit demo lab clean gpu-proof gpu-check

help:
	@echo "make book     execute every notebook (MACHINE=$(MACHINE) BACKEND=$(BACKEND) BUDGET=$(BUDGET)) and build _build/html"
	@echo "make test     unit tests plus a smoke run of every notebook: side by side (TEST_WORKERS=$(TEST_WORKERS)), then the serial ones alone"
	@echo "make install  create .venv, install the project and register its Jupyter kernel 'gpuhive'"
	@echo "make lab      open JupyterLab on the notebooks, with the project's kernel"
	@echo "make audit    the security audit: the injection suite against the three gates"
	@echo "make demo     train briefly, then evaluate, end to end (MACHINE=$(MACHINE), smoke budget)"
	@echo "make lint     ruff over lib and tests, and the import contracts"
	@echo "make clean    remove build output (keeps .venv)"
	@echo "make gpu-proof  on a GPU machine: the GPU proof in at most 7 minutes (_build/gpu-proof/report.json); installs nothing"
	@echo "make gpu-check  the same as gpu-proof"

# Everything a command needs is installed here, once: the package with every
# extra, and a Jupyter kernel named 'gpuhive' that runs in this environment
# (the notebooks ask for it; --sys-prefix keeps it inside .venv).
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,book,gpu,llm]'
	@# ipykernel stages the spec in a temporary folder it does not remove: keep it in _build
	@mkdir -p _build/tmp
	TMPDIR=$(CURDIR)/_build/tmp $(BIN)/python -m ipykernel install --sys-prefix --name gpuhive --display-name "Python (GPUHive)" > /dev/null
	@rm -rf _build/tmp
	@# one decision compiles the learned policy's kernel (Numba caches it beside
	@# lib/policies/fastpath.py), so a user's first decision does not wait for it
	$(BIN)/gpuhive decide --kind reduce --dim N=4096 > /dev/null
	@touch $(STAMP)

install venv: $(STAMP)

book: $(STAMP)
	$(BIN)/gpuhive book --machine $(MACHINE) --backend $(BACKEND) --budget $(BUDGET) --seed $(SEED)

# Two phases: the tests side by side on TEST_WORKERS workers, then the tests
# marked serial (they measure this computer) alone; both run even if the first fails,
# and each ends with its slowest tests (the suite should stay well under ten minutes).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : n )))
test: $(STAMP)
	@rc=0; \
	$(BIN)/python -m pytest -q -m "not serial" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 || rc=$$?; \
	$(BIN)/python -m pytest -q -m serial --durations=10 || rc=$$?; \
	exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check lib tests
	$(BIN)/lint-imports

audit: $(STAMP)
	$(BIN)/gpuhive security-audit --end-to-end

# A short end-to-end run: train a policy at the smoke budget into _build/demo,
# then evaluate that policy against the baselines on the same machine.
demo: $(STAMP)
	$(BIN)/gpuhive train --machine $(MACHINE) --budget smoke --seed $(SEED) --out _build/demo
	$(BIN)/gpuhive evaluate --machine $(MACHINE) --backend $(BACKEND) --budget smoke --seed $(SEED) --policy _build/demo/policy.npz

LAB_PORT ?= 8888
lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks --ip=127.0.0.1 --port=$(LAB_PORT) --MappingKernelManager.default_kernel_name=gpuhive $(if $(filter 0,$(shell id -u)),--allow-root,)

clean:
	rm -rf _build figures/*/

# On a GPU machine (a lent one has no network, so nothing is installed): every
# kind and dtype, shards sharing one GPU, the grid and indexing limits, a
# re-plan after an injected fault, multi-GPU merges where there are two GPUs,
# pytest -m gpu and compute-sanitizer, in at most seven minutes.
PROOF_PY := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-proof:
	timeout -k 10 450 $(PROOF_PY) -m lib.execution.gpu_proof --out _build/gpu-proof --timeout-s 420

gpu-check: gpu-proof
