"""A demo-sized cross-seed experiment through the real workflow: 3 seeds and both controls
trained, every checkpoint measured on one held-out reference set, compared and drawn."""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/seeds", "seq_len": 16, "shuffle_group_blocks": 4},
    "training": {"batch_size": 4, "micro_batch_size": 2, "tokens": 512, "epochs": 2, "lr": 0.01},
}
SETTINGS = {
    "reference_rows": 4,
    "cov_num_batches": 3,
    "cov_batch_size": 2,
    "top_k": 2,
    "hutchinson_samples": 4,
    "hessian_eig_every": 2,
    "lanczos_steps": 8,
    "hvp_batch_size": 4,
}


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    return subprocess.run(
        [
            str(SNAKEMAKE),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(workdir),
            "--configfile",
            str(workdir / "config.yaml"),
            "--replace-workflow-config",
            "-c2",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )


def _config(workdir: Path, **experiment) -> None:
    (workdir / "run.yaml").write_text(yaml.safe_dump(RUN))
    entry = {
        "config": str(workdir / "run.yaml"),
        "shard_tokens": 64,
        "seeds": [1, 2, 3],
        "settings": SETTINGS,
        **experiment,
    }
    config = {
        "train_runs": {},
        "analyses": {},
        "seed_experiments": {"tiny": entry},
        "seed_comparisons": {
            "all": {"experiments": ["tiny"], "labels": ["tiny seeds"], "metrics": ["eval_loss", "gradient_cosine"]}
        },
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    path = tmp_path_factory.mktemp("seeds")
    _config(path)
    done = _snakemake(path, "seeds")
    assert done.returncode == 0, done.stderr[-4000:]
    return path


def _rows(path: Path) -> list[dict]:
    with open(path / "results/tiny/comparison.csv") as handle:
        return list(csv.DictReader(handle))


def test_every_checkpoint_of_every_run_is_measured_and_compared(experiment):
    runs = ["tiny-seed-1", "tiny-seed-2", "tiny-seed-3", "tiny-same-seed", "tiny-data-order"]
    for run in runs:
        records = sorted((experiment / f"results/tiny/geometry/{run}").glob("*.json"))
        assert [p.stem for p in records] == ["epoch-000", "epoch-001", "epoch-002"]
        record = json.loads(records[1].read_text())
        assert record["init_seed"] == {"tiny-same-seed": 1, "tiny-data-order": 1}.get(run) or int(run[-1])
        assert "hessian_top1_eigenvalue" not in record["metrics"]  # every 2nd checkpoint only
    data_seeds = {
        json.loads((experiment / f"results/tiny/geometry/{run}/epoch-002.json").read_text())["data_seed"]
        for run in runs
    }
    assert len(data_seeds) == 2  # the data-order control alone differs
    rows = _rows(experiment)
    value = {(r["step"], r["subject"], r["metric"]): r for r in rows}
    twin = value[("8", "tiny-same-seed|tiny-seed-1", "gradient_cosine")]
    assert abs(float(twin["value"]) - 1) < 1e-12 and twin["role"] == "same-seed"  # deterministic training
    assert value[("8", "tiny-data-order|tiny-seed-1", "gradient_cosine")]["role"] == "data-order"
    assert float(value[("8", "tiny-seed-1|tiny-seed-2", "gradient_cosine")]["value"]) < 1 - 1e-6
    reference = json.loads((experiment / "results/tiny/reference.json").read_text())
    assert reference["held_out"] and len(reference["positions"]) == 4
    for figure in ("results/tiny/figures/dashboard.png", "results/comparisons/all/comparison.png"):
        assert (experiment / figure).stat().st_size > 10_000


def test_a_rerun_does_nothing_and_figures_redraw_alone(experiment):
    assert "Nothing to be done" in _snakemake(experiment, "seeds", "-n").stdout
    (experiment / "results/tiny/figures/dashboard.png").unlink()
    plan = _snakemake(experiment, "seeds", "-n").stdout
    assert "compare_seeds" in plan and "measure_geometry" not in plan and "train_run" not in plan


def test_the_cli_compares_experiments(experiment, tmp_path):
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        [
            str(SNAKEMAKE.with_name("tiny-llm")),
            "compare",
            "--inputs",
            str(experiment / "results/tiny"),
            "--metrics",
            "fisher_trace",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "comparison.png").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"settings": {**SETTINGS, "rows": 3}},
            "seed_experiments.tiny.settings: unknown key rows; allowed keys: reference_rows",
        ),
        ({"seeds": [1]}, "seeds"),
    ],
)
def test_bad_experiments_stop_at_start_up(tmp_path, change, message):
    _config(tmp_path, **change)
    done = _snakemake(tmp_path, "seeds", "-n")
    assert done.returncode != 0
    assert re.search(message, done.stderr + done.stdout), (done.stderr + done.stdout)[-2000:]
