"""Static checks of the workflow: snakefmt formatting, snakemake --lint, the default DAG."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from builders import PROJECT, project_view

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, env=env)


def test_workflow_is_snakefmt_formatted():
    result = _run(str(BIN / "snakefmt"), "--check", "Snakefile", "workflow/")
    assert result.returncode == 0, result.stdout + result.stderr


def test_lint_has_no_findings(tmp_path):
    project_view(tmp_path)
    result = _run(
        str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--lint"
    )
    assert result.returncode == 0 and "Congratulations" in result.stdout + result.stderr, result.stdout + result.stderr


def test_default_config_plans_the_demo(tmp_path):
    """The configuration as it stands plans (whatever its user added); while it holds the demo's
    entries, the plan trains and analyses the demo."""
    project_view(tmp_path)
    result = _run(str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n")
    plan = result.stdout + result.stderr
    assert result.returncode == 0, plan[-3000:]
    config = yaml.safe_load((PROJECT / "config/config.yaml").read_text()) or {}
    if "demo" not in (config.get("train_runs") or {}) or "demo" not in (config.get("analyses") or {}):
        pytest.skip("config/config.yaml no longer trains and analyses the demo (edited by its user); it plans")
    for rule in ("prepare_data", "train_run", "index_states", "collect", "plot", "all"):
        assert re.search(rf"^{rule} +\d+$", plan, re.M), f"{rule} missing from the plan"
    assert "checkpoint jobs" in plan  # analysis jobs appear once the index checkpoint has run


def _uncomment_own_corpus(text: str) -> str:
    """config/config.yaml with its commented text-example entries uncommented, as the README says."""
    return (
        "\n".join(
            line.replace("# ", "", 1) if line.startswith(("  # text-example:", "  #   ")) else line
            for line in text.splitlines()
        )
        + "\n"
    )


def test_the_configuration_tests_pass_after_the_readme_own_corpus_edit(tmp_path):
    """make test passes whatever the user has in config/: the tests that plan the project's own
    configuration, run against a project whose config.yaml has the README's own-corpus edit (the
    text-example entries uncommented, a corpus of the user's at a path of their choosing)."""
    project = tmp_path / "project"
    shutil.copytree(PROJECT / "config", project / "config")
    edited = _uncomment_own_corpus((project / "config/config.yaml").read_text())
    assert "  text-example:" in edited
    (project / "config/config.yaml").write_text(edited.replace("data/my-corpus.txt", "corpus/plays.txt"))
    (project / "corpus").mkdir()
    (project / "corpus/plays.txt").write_text("ACT I. Enter two players, talking. " * 10_000)
    tests = [
        "tests/integration/test_workflow_checks.py::test_default_config_plans_the_demo",
        "tests/integration/test_workflow_checks.py::test_own_corpus_example_sizes_and_plans",
        "tests/integration/test_workflow_checks.py::test_lint_has_no_findings",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "TINY_LLM_TEST_PROJECT": str(project)},
    )
    assert result.returncode == 0 and "3 passed" in result.stdout, (result.stdout + result.stderr)[-4000:]


def test_own_corpus_example_sizes_and_plans(tmp_path):
    """config/runs/text-example.yaml needs the corpus size it states, and the commented text-example
    entries of config/config.yaml, uncommented (or as the user uncommented them), plan a text
    cache, training and its analysis."""
    from tiny_llm.config import load_config
    from tiny_llm.data.tokens import capacity_blocks

    example = load_config(PROJECT / "config/runs/text-example.yaml")
    needed = capacity_blocks(example)["unseen"] * example.data.seq_len + 1
    assert 327_680 <= needed <= 330_000 and example.training.checkpoint_policy == "interval"
    config = yaml.safe_load(_uncomment_own_corpus((PROJECT / "config/config.yaml").read_text()))
    if "text-example" not in (config.get("train_runs") or {}) or "text-example" not in (config.get("analyses") or {}):
        pytest.skip("config/config.yaml no longer holds the commented text-example entries (edited by its user)")
    assert config["train_runs"]["text-example"]["cache_source"] == "text"
    (tmp_path / "data").mkdir()
    (tmp_path / "data/my-corpus.txt").write_text("a small corpus of my own. " * 13_000)  # 338 KB
    config["train_runs"]["text-example"]["cache_inputs"] = ["data/my-corpus.txt"]
    project_view(tmp_path)
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(config))
    result = _run(
        str(BIN / "snakemake"),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--configfile",
        str(tmp_path / "own.yaml"),
        "-n",
        "runs/text-example/trained.json",
    )
    plan = result.stdout + result.stderr
    assert result.returncode == 0, plan[-3000:]
    assert re.search(r"^prepare_data +1$", plan, re.M) and re.search(r"^train_run +1$", plan, re.M)
    # The stated size suffices: a 338 KB corpus covers training and the unseen epoch.
    from tiny_llm.cli import main
    from tiny_llm.data.tokens import TokenCache, check_capacity

    assert (
        main(
            [
                "--quiet",
                "prepare-data",
                "--config",
                str(REPO / "config/runs/text-example.yaml"),
                "--source",
                "text",
                str(tmp_path / "data/my-corpus.txt"),
                "--out",
                str(tmp_path / "cache/own"),
            ]
        )
        == 0
    )
    check_capacity(TokenCache(tmp_path / "cache/own"), example, "unseen")


def test_workflow_runs_default_to_interval_checkpoints_and_print_their_cost(tmp_path):
    """A run the workflow trains writes a state per virtual epoch unless its configuration says
    otherwise; the dry run prints the analysis's cost line before any job."""
    import yaml

    demo = yaml.safe_load((REPO / "config/runs/demo.yaml").read_text())
    del demo["training"]["checkpoint_policy"]
    (tmp_path / "config/runs").mkdir(parents=True)
    (tmp_path / "config/runs/mine.yaml").write_text(
        yaml.safe_dump({**demo, "data": {**demo["data"], "cache": "cache/mine"}})
    )
    (tmp_path / "config/config.yaml").write_text(
        yaml.safe_dump(
            {
                "train_runs": {
                    "mine": {"config": "config/runs/mine.yaml", "cache_source": "demo"},
                    "last": {
                        "config": "config/runs/mine.yaml",
                        "set": {"training.checkpoint_policy": "final"},
                        "cache_source": "demo",
                    },
                },
                "analyses": {
                    "mine": {"run": "runs/mine", "settings": {"device": "cpu", "noise_samples": 3}},
                    "last": {"run": "runs/last", "settings": {"device": "cpu"}},
                },
            }
        )
    )
    result = _run(str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert (
        "analysis mine: ≤ 5 states (interval checkpoints: initialisation + 4 epochs) × 2 cases = 10 (state, case) jobs"
        in out
    )
    assert "analysis last: ≤ 1 states (final checkpoint only" in out
    # 36 forms in each geometry (the plain one and Adam's, whose moments the run keeps) and the step Δ
    # to the successor, whose loss at θ + Δ is a forward pass over the epoch
    assert "each: 22 gradient micro-batches, 73 quadratic forms in 5 passes × 16 curvature micro-batches, " in out
    assert "forward micro-batches (the loss at θ + Δ; not at the last state)" in out


def test_the_await_rules_have_the_params_of_the_rules_they_stand_in_for():
    """A re-attached result is recorded as made by the rule it stands in for only if the params
    match (rerun-triggers include params): every param of that rule is one of the await rule's."""
    from tiny_llm.campaign.slurm_jobs import STANDS_IN

    text = "\n".join(p.read_text() for p in sorted((REPO / "workflow/rules").glob("*.smk")))

    def params(rule):
        block = re.search(rf"rule {rule}:\n(.*?)(?=\n\s*rule |\n\s*ruleorder|\Z)", text, re.S).group(1)
        found = re.search(r"\n(\s*)params:\n((?:\1\s+.*\n)+)", block)
        return set() if found is None else set(re.findall(r"^\s+(\w+)=", found.group(2), re.M))

    for waiting, stood_in in STANDS_IN.items():
        assert params(waiting) == params(stood_in), (waiting, stood_in)
    assert "aliases" in params("await_result")
