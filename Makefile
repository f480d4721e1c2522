# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the test suite).
# Both create or reuse .venv/ and install everything from envs/requirements.txt and pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo seeds-demo cbs-demo cbs-study test test-slow test-llc bench-peers gpu-check clean-demo

# TORCH_INDEX: a wheel index to take torch from first, e.g. PyTorch's CPU index for a CPU-only build
# (see envs/requirements.txt); empty: torch as PyPI serves it.
TORCH_INDEX ?=

$(STAMP): pyproject.toml envs/requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing torch, snakemake and the rest into $(VENV) (1-3 minutes, once)..."
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --quiet --disable-pip-version-check --index-url $(TORCH_INDEX) \
		"torch==$$(sed -n 's/^torch==//p' envs/requirements.txt)")
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r envs/requirements.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c1

# A demo-sized cross-seed experiment (3 seeds and 2 controls of the demo model), alone.
seeds-demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c1 --configfile config/seeds-demo.yaml --replace-workflow-config

# A demo-sized critical-batch-size experiment (the demo model branched from 3 checkpoints with 3
# batch sizes over 5 data seeds, each its own sequences), alone: about 4 minutes on 2 cores.
cbs-demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c2 --configfile config/cbs-demo.yaml --replace-workflow-config

# The full critical-batch-size study (3 checkpoints × 3 batch sizes × 4 learning rates × 5 seeds,
# with Adam and with SGD), alone: about 25 minutes on 2 cores.
cbs-study: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c2 --configfile config/cbs-study.yaml --replace-workflow-config

# Two workers, each taking whole test files (a file's tests share its fixtures, in order), in the
# order tests/conftest.py collects them: the Slurm tests, which mostly wait, first.
# ruff (settings and the reasons for its rules in pyproject.toml) first: a style finding fails fast.
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks workflow/scripts
	$(BIN)/ruff format --check src tests benchmarks workflow/scripts
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=30

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

# The optional local learning coefficient: installs devinterp (about 400 MB) and tests it.
test-llc: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[llc]'
	$(BIN)/python -m pytest -m llc

# Our engines beside the peers (curvlinops, hessian-eigenthings) at GPT-2-small and Pythia-160M
# shapes (about 40 minutes on one CPU thread); the table is in benchmarks/README.md.
bench-peers: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -r benchmarks/requirements-peers.txt
	$(BIN)/python benchmarks/real_shapes.py

# On a machine with a CUDA GPU: CUDA tests, walltime calibration, GPU benchmarks and precision
# study in one go (at most 9 minutes); report in benchmarks/out/gpu-check/report.md. With
# `make gpu-check PYTHON=python3` it runs with that interpreter as it is (a CUDA torch, pytest,
# pyyaml, pandas; the source on PYTHONPATH): no .venv, no install, no network.
ifeq ($(origin PYTHON),command line)
gpu-check:
	PYTHON=$(PYTHON) benchmarks/gpu_check.sh
else
gpu-check: $(STAMP)
	PYTHON=$(BIN)/python benchmarks/gpu_check.sh
endif

clean-demo:
	rm -rf cache/demo cache/demo.prepared.json runs/demo results/demo results/benchmarks logs .snakemake
