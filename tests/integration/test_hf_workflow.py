"""The workflow on models trained elsewhere: two checkpoints of a tiny GPT-NeoX (Pythia's
architecture, kept as transformers' own model with ``adapter: true``, as any architecture we do not
read natively is) saved as transformers' Trainer saves them (tokenizer and
trainer_state.json in each), listed in an analysis (hf_checkpoints) without steps or tokens, with
the shipped configuration's plots section: the workflow prepares the cache with the checkpoints'
own tokenizer, imports them (steps and tokens from trainer_state.json), analyses them on the offset
case with an HVP engine and draws every figure; a rerun does nothing. In the same workflow run, a
seed experiment of two such suites trained elsewhere from two initialisations (one checkpoint list
per seed, as PolyPythia publishes them), imported natively and compared at equal steps."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tiny_llm.cli import main
from tiny_llm.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_suites import BATCH, SEQ, corpus_text, make_suite, run_config_text

REPO = Path(__file__).resolve().parents[2]
GEOMETRY = {
    "reference_rows": 4,
    "cov_num_batches": 3,
    "cov_batch_size": 2,
    "top_k": 2,
    "hutchinson_samples": 2,
    "hessian_eig_every": 2,
    "lanczos_steps": 4,
    "hvp_batch_size": 4,
}
"""A cheap seed-experiment measurement (as the seeds workflow test's)."""
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


@pytest.mark.slow  # about 2 minutes: make test-slow (a suite through the workflow: test_order_workflow.py)
def test_imported_checkpoints_of_a_third_architecture_through_the_workflow(tmp_path):
    (tmp_path / "corpus.txt").write_text(corpus_text())
    make_suite(tmp_path / "suite", steps=(3, 6))
    make_suite(tmp_path / "suite-seed-1", steps=(3, 6), seed=1)
    (tmp_path / "run.yaml").write_text(run_config_text("cache/pythia"))
    (tmp_path / "poly.yaml").write_text(run_config_text("cache/poly"))
    os.chdir(tmp_path)
    settings = {
        "device": "cpu",
        "dtype": "float64",
        "engine": "double_backward",
        "noise_samples": 2,
        "random_samples": 2,
        "directions_per_pass": 2,
        "data_offset": 2,
    }
    checkpoints = [{"path": "suite/out/checkpoint-3"}, {"path": "suite/out/checkpoint-6"}]
    spectrum = {
        "enabled": True,
        "top_k": 1,
        "lanczos_steps": 4,
        "slq_vectors": 1,
        "slq_steps": 3,
        "block_samples": 1,
        "cg_max_iterations": 3,
    }
    shipped = yaml.safe_load((REPO / "config/config.yaml").read_text())["plots"]
    assert shipped["training_norms"] is True  # what failed the plot of an imported run before
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "plots": shipped,
                "analyses": {
                    "pythia": {
                        "hf_checkpoints": checkpoints,
                        "adapter": True,
                        "config": "run.yaml",
                        "cache_inputs": ["corpus.txt"],
                        "settings": settings,
                        "spectrum": spectrum,
                    }
                },
                "seed_experiments": {
                    "poly": {
                        "hf_checkpoints": {
                            0: checkpoints,
                            1: [{"path": f"suite-seed-1/out/checkpoint-{s}"} for s in (3, 6)],
                        },
                        "config": "poly.yaml",
                        "cache_inputs": ["corpus.txt"],
                        "settings": GEOMETRY,
                    }
                },
            }
        )
    )
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        [
            str(SNAKEMAKE),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(tmp_path / "config.yaml"),
            "-c2",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for seed in (0, 1):  # the seeds trained elsewhere, imported natively
        assert load_config(tmp_path / f"runs/poly-seed-{seed}/resolved.yaml").model.architecture == "gpt_neox"
    compared = list(csv.DictReader((tmp_path / "results/poly/comparison.csv").open()))
    pairs = {(int(r["step"]), r["metric"]) for r in compared if r["kind"] == "pair"}
    assert {(3, "gradient_cosine"), (6, "gradient_cosine")} <= pairs, sorted(pairs)[:6]
    assert {r["subject"] for r in compared if r["kind"] == "run"} == {"poly-seed-0", "poly-seed-1"}
    assert (tmp_path / "results/poly/figures/dashboard.png").stat().st_size > 0
    results = tmp_path / "results/pythia"
    rows = list(csv.DictReader((results / "summary.csv").open()))
    assert [(r["case"], int(r["step"]), int(r["tokens"]), r["source"]) for r in rows] == [
        ("offset", s, s * BATCH * SEQ, f"checkpoint-{s}") for s in (3, 6)
    ]
    assert all(float(r["noise_curvature"]) != 0 and r["noise_gauss_newton"] == "" for r in rows)
    measured = [json.loads(path.read_text()) for path in sorted(results.glob("states/*/offset.json"))]
    result = next(r for r in measured if r["trajectory"] is None)  # the last state: no successor to pass below
    assert result["data"]["plan"] == "offset-2" and result["precision"]["engine"] == "double_backward"
    assert result["data"]["tokenizer"]["type"] == "huggingface"
    assert (
        result["data"]["tokenizer"]["files"]["tokenizer.json"]
        == json.loads((tmp_path / "runs/pythia/imported.json").read_text())["tokenizer"]["files"]["tokenizer.json"]
    )
    # The command line's numbers for that state (same settings; other thread counts sum in another order).
    alias = result["state"]["aliases"][0]["file"]
    assert (
        main(
            [
                "--quiet",
                "analyze-state",
                "--run",
                "runs/pythia",
                "--checkpoint",
                alias,
                "--case",
                "offset",
                "--output",
                str(tmp_path / "direct.json"),
                "--device",
                "cpu",
                "--dtype",
                "float64",
                "--engine",
                "double_backward",
                "--noise-samples",
                "2",
                "--random-samples",
                "2",
                "--directions-per-pass",
                "2",
                "--data-offset",
                "2",
            ]
        )
        == 0
    )
    direct = json.loads((tmp_path / "direct.json").read_text())["statistics"]
    assert direct.keys() == result["statistics"].keys()
    assert all(v == pytest.approx(result["statistics"][k], rel=1e-9) for k, v in direct.items() if v is not None)
    assert json.loads((tmp_path / "runs/pythia/imported.json").read_text())["architecture"] == "hf"
    again = subprocess.run(
        [
            str(SNAKEMAKE),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(tmp_path / "config.yaml"),
            "-c2",
            "-n",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert "Nothing to be done" in again.stdout + again.stderr, (again.stdout + again.stderr)[-3000:]
    # an offset epoch past the prepared cache is refused at start-up, by key
    from tiny_llm.campaign.workflow import WorkflowPlan

    far = yaml.safe_load((tmp_path / "config.yaml").read_text())
    entry = far["analyses"].pop("pythia")
    far["analyses"]["far"] = {**entry, "settings": {**settings, "data_offset": 10**6}}
    with pytest.raises(ValueError, match=r"analyses.far.settings.data_offset=1000000: the offset epoch"):
        WorkflowPlan(far)
    spectra = list(csv.DictReader((results / "spectrum.csv").open()))
    assert sorted(int(r["step"]) for r in spectra) == [3, 6] and all(r["case"] == "offset" for r in spectra)
    # float32 with its precision audit, whose float64 reference uses an HVP engine here
    assert (
        main(
            [
                "--quiet",
                "analyze-state",
                "--run",
                "runs/pythia",
                "--checkpoint",
                alias,
                "--case",
                "offset",
                "--output",
                str(tmp_path / "audited.json"),
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--noise-samples",
                "2",
                "--random-samples",
                "2",
                "--directions-per-pass",
                "2",
            ]
        )
        == 0
    )
    audit = json.loads((tmp_path / "audited.json").read_text())["audit"]
    assert "double_backward-engine forms" in audit["reference"] and audit["max_statistic_relative_error"] < 1e-3
    figures = sorted(p.name for p in (results / "figures").glob("*.png"))
    assert {"loss.png", "noise_alignment.png", "batch_sizes.png"} <= set(figures), figures
