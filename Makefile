# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the test suite).
# Both create or reuse .venv/ and install everything from envs/requirements.txt and pyproject.toml.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo seeds-demo test test-slow test-llc gpu-check clean-demo

$(STAMP): pyproject.toml envs/requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing torch, snakemake and the rest into $(VENV) (1-3 minutes, once)..."
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r envs/requirements.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c1

# A demo-sized cross-seed experiment (3 seeds and 2 controls of the demo model), alone.
seeds-demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/snakemake -c1 --configfile config/seeds-demo.yaml --replace-workflow-config

test: $(STAMP)
	$(BIN)/python -m pytest

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

# The optional local learning coefficient: installs devinterp (about 400 MB) and tests it.
test-llc: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[llc]'
	$(BIN)/python -m pytest -m llc

# On a machine with a CUDA GPU: CUDA tests, GPU benchmarks, precision study and walltime
# calibration in one go (about 8 minutes); report in benchmarks/out/gpu-check/report.md.
gpu-check: $(STAMP)
	PYTHON=$(BIN)/python benchmarks/gpu_check.sh

clean-demo:
	rm -rf cache/demo cache/demo.prepared.json runs/demo results/demo results/benchmarks logs .snakemake
