"""The cluster set-up names files that exist and pins one torch; the GPU check fails fast and
clearly where there is no GPU (as in CI)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _cluster_section() -> str:
    """The cluster set-up as documented: its page, and the README's ten lines."""
    readme = (REPO / "README.md").read_text()
    return (REPO / "docs/cluster.md").read_text() + readme.split("## The cluster", 1)[1].split("\n## ", 1)[0]


def test_every_file_the_cluster_setup_names_exists():
    named = set(
        re.findall(r"(?<![\w/.-])((?:envs|profiles|config|benchmarks|workflow)/[\w./+-]*[\w])", _cluster_section())
    )
    assert "envs/cluster-aarch64.txt" in named and "envs/tiny-llm.yaml" in named
    missing = sorted(
        path for path in named if not (REPO / path).exists() and not path.startswith("benchmarks/out/")
    )  # outputs the set-up makes
    assert not missing, f"the cluster set-up (docs/cluster.md, README) names files that do not exist: {missing}"
    requirements = (REPO / "envs/cluster-aarch64.txt").read_text()
    for line in re.findall(r"^-r (\S+)$", requirements, re.M):
        assert (REPO / "envs" / line).exists(), line
    assert "http" not in requirements.replace("https://", "") and "<" not in requirements  # no placeholders


def test_one_torch_everywhere():
    pins = {
        path.name: re.findall(r"torch==([\d.]+)", path.read_text())
        for path in (REPO / "envs").iterdir()
        if path.suffix in (".txt", ".yaml")
    }
    versions = {v for found in pins.values() for v in found}
    assert len(versions) == 1, pins
    assert torch.__version__.split("+")[0] in versions


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where there is no GPU")
def test_gpu_check_fails_fast_and_clearly_without_cuda():
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "gpu-check: no CUDA device is visible" in result.stderr and "GPU node" in result.stderr


FAKE_SITE = """
import importlib.abc, sys

class _Absent(importlib.abc.MetaPathFinder):  # this interpreter has no snakemake
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "snakemake":
            raise ModuleNotFoundError("No module named 'snakemake'")

sys.meta_path.insert(0, _Absent())
import torch
torch.cuda.is_available = lambda: True  # past the GPU gate, so that the first step starts
"""


@pytest.mark.slow  # about a minute: make test-slow
def test_gpu_check_runs_with_the_given_interpreter_as_it_is(tmp_path):
    """PYTHON=<interpreter> without snakemake and without .venv: the first step runs with it, and the
    report is written after each step, also when the time runs out (later steps skipped)."""
    checkout = tmp_path / "checkout"
    for name in ("benchmarks", "src", "tests", "config"):
        shutil.copytree(REPO / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__", "out"))
    shutil.copy(REPO / "pyproject.toml", checkout / "pyproject.toml")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(FAKE_SITE)
    python = fake / "python3"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{fake}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    assert subprocess.run([str(python), "-c", "import snakemake"], capture_output=True).returncode != 0
    # the first step alone (GPU_CHECK_STEPS), with the time it needs; the others are left out by name
    env = {**os.environ, "PYTHON": str(python), "GPU_CHECK_SECONDS": "130", "GPU_CHECK_STEPS": "cuda-tests"}
    result = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=240
    )
    out = checkout / "benchmarks/out/gpu-check"
    assert result.returncode == 1, result.stderr[-2000:]  # the fake GPU fails its steps: reported, not fatal
    assert "gpu-check: cuda-tests (at most" in result.stderr and not (checkout / ".venv").exists()
    log = (out / "cuda-tests.log").read_text()
    # pytest ran with that interpreter: its progress line (or, given the time, its summary) is there
    assert re.match(r"[.sFEx]+", log) or "test_" in log, log[-2000:]
    report = (out / "report.md").read_text()
    assert "| cuda-tests | failed" in report and "| memory-model | left out: not in GPU_CHECK_STEPS" in report
    assert "No module named 'snakemake'" not in log
    # a budget that no step's limit fits: every step left out by name, none cut short, nothing failed
    env = {**os.environ, "PYTHON": str(python), "GPU_CHECK_SECONDS": "15"}
    result = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=240
    )
    report = (out / "report.md").read_text()
    assert result.returncode == 0 and "| cuda-tests | left out: needs up to 120 s, 15 s left" in report, report
    assert "| real-shapes-compiled | left out: about 120 s of first compilation" in report


@pytest.mark.slow  # starts every benchmark script: make test-slow
def test_benchmark_scripts_document_their_options():
    for script in ("hvp_cost.py", "precision.py", "spectrum_cost.py", "memory.py", "real_shapes.py"):
        result = subprocess.run(
            [sys.executable, f"benchmarks/{script}", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0 and "--device" in result.stdout, script + result.stderr
