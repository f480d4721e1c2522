"""Static checks of the workflow: snakefmt formatting, snakemake --lint, the default DAG."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, env=env)


def test_workflow_is_snakefmt_formatted():
    result = _run(str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/")
    assert result.returncode == 0, result.stdout + result.stderr


def test_lint_has_no_findings(tmp_path):
    (tmp_path / "config").symlink_to(REPO / "config")
    result = _run(str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--lint")
    assert result.returncode == 0 and "Congratulations" in result.stdout + result.stderr, result.stdout + result.stderr


def test_default_config_plans_the_demo(tmp_path):
    (tmp_path / "config").symlink_to(REPO / "config")
    result = _run(str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n")
    plan = result.stdout + result.stderr
    assert result.returncode == 0, plan[-3000:]
    for rule in ("prepare_data", "train_run", "index_states", "collect", "plot", "all"):
        assert re.search(rf"^{rule} +1$", plan, re.M), f"{rule} missing from the plan"
    assert "checkpoint jobs" in plan  # analysis jobs appear once the index checkpoint has run
