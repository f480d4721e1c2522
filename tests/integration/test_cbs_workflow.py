"""A critical-batch-size experiment through the real workflow: the base run, its branches (one of
them killed part-way and resumed by the workflow without loss), the analysis at the checkpoint, the
held-out losses, cbs.csv and the figure."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.model.checkpoint import load_train_state
from tiny_llm.training.loop import train

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/cbs", "seq_len": 16, "shuffle_group_blocks": 4},
    "training": {"batch_size": 4, "micro_batch_size": 2, "tokens": 4 * 16 * 8 * 4, "epochs": 4, "lr": 0.01},
}
EXPERIMENT = {
    "config": "run.yaml",
    "shard_tokens": 256,
    "checkpoints": [1],
    "batch_sizes": [2, 4, 8],
    "data_seeds": [1, 2],
    "token_budget": 32 * 16,
    "lr_factors": [0.5, 1, 2],
    "optimizer_memory": "tokens",
    "eval_sequences": 16,
    "settings": {"noise_samples": "all", "random_samples": 2, "device": "cpu", "dtype": "float64"},
}
KILLED = "tiny-e001-b2-s1"
SEED_SETTINGS = {"reference_rows": 4, "cov_num_batches": 3, "cov_batch_size": 2, "top_k": 2, "hutchinson_samples": 4}
SEED_SETTINGS |= {"hessian_eig_every": 2, "lanczos_steps": 8, "hvp_batch_size": 4}


def _snakemake(workdir: Path, *args: str, configfile: str = "config.yaml") -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    command = [str(SNAKEMAKE), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--configfile", str(workdir / configfile), "--replace-workflow-config", "-c2", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    path = tmp_path_factory.mktemp("cbs")
    (path / "run.yaml").write_text(yaml.safe_dump(RUN))
    config = {"train_runs": {}, "analyses": {}, "cbs_experiments": {"tiny": EXPERIMENT}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    base = _snakemake(path, "runs/tiny-base/trained.json")
    assert base.returncode == 0, base.stderr[-4000:]
    assert "× 3 learning rates (0.5, 1, 2 × the rule's) × 2 data seeds = 18 branch runs" in base.stderr
    assert "Adam's memory −1/ln β2 by batch: 2: 39 steps = 1,248 tokens, 4: 19.5 steps = 1,248 tokens" in base.stderr
    assert "warning: cbs_experiments.tiny.token_budget: the largest batch's branches train 4 steps" in base.stderr
    cwd = Path.cwd()
    os.chdir(path)
    try:  # a branch killed after half its budget, while writing its log
        branch = WorkflowPlan(config).run_configs[KILLED]
        train(branch, path / "runs" / KILLED, stop_after_epoch=2)
        with open(path / "runs" / KILLED / "train-log.jsonl", "a") as log:
            log.write('{"step": 9, "epo')
    finally:
        os.chdir(cwd)
    done = _snakemake(path)
    assert done.returncode == 0, done.stderr[-4000:]
    return path, branch


def test_the_critical_batch_stands_beside_the_noise_scales(experiment):
    path, _ = experiment
    with open(path / "results/tiny/cbs.csv") as handle:
        tuned, row = list(csv.DictReader(handle))
    assert (tuned["rates"], row["rates"]) == ("tuned", "rule") and int(tuned["cbs"]) in (4, 8)
    assert (row["checkpoint"], row["step"], row["tokens"]) == ("epoch-001", "8", str(8 * 4 * 16))
    assert int(row["cbs"]) in (4, 8) and row["base_batch"] == "4" and row["case"] == "unseen"
    assert float(row["b_simple"]) > 0 and row["b_crit_target"] != ""
    assert float(row["b_simple_tokens"]) == pytest.approx(16 * float(row["b_simple"]))
    record = json.loads((path / "results/tiny/branches/epoch-001.json").read_text())
    assert sorted((b["batch_size"], b["seed"], b["lr_factor"]) for b in record["branches"]) == [
        (b, s, f) for b in (2, 4, 8) for s in (1, 2) for f in (0.5, 1, 2)
    ]
    assert {b["beta2"] for b in record["branches"] if b["batch_size"] == 8} == {0.95**2}
    assert all([t for t, _ in b["curve"]] == [0, 128, 256, 384, 512] for b in record["branches"])
    with open(path / "results/tiny/branches.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["rates"], int(r["batch_size"])) for r in rows] == [(k, b) for k in ("tuned", "rule") for b in (2, 4, 8)]
    with open(path / "results/tiny/curves.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 3 * 2 * 3 * 5  # every branch, every point
    with open(path / "results/tiny/rates.csv") as handle:
        assert [(r["batch_size"], r["lr_factor"]) for r in csv.DictReader(handle)] == [
            (b, f) for b in ("2", "4", "8") for f in ("0.5", "1.0", "2.0")
        ]
    fits = (path / "results/tiny/fits.csv").read_text()
    assert fits.startswith("checkpoint,rates,target_loss,batch_sizes,tokens_needed,censored")
    assert (path / "results/tiny/figures/critical_batch.png").stat().st_size > 10_000
    assert (path / "results/tiny/summary.csv").exists()  # the analysis of the base run


def test_a_killed_branch_resumed_by_the_workflow_lost_nothing(experiment, tmp_path):
    path, branch = experiment
    log = [json.loads(line) for line in (path / "runs" / KILLED / "train-log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 17))  # 512 tokens in batches of 2 × 16
    cwd = Path.cwd()
    os.chdir(path)
    try:
        train(branch, tmp_path / "uninterrupted")
    finally:
        os.chdir(cwd)
    resumed = load_train_state(path / "runs" / KILLED / "final.pt")["model"]
    whole = load_train_state(tmp_path / "uninterrupted" / "final.pt")["model"]
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_a_rerun_does_nothing(experiment):
    path, _ = experiment
    assert "Nothing to be done" in _snakemake(path, "-n").stdout


def test_the_demos_live_side_by_side_in_one_folder(experiment):
    """As make demo, make cbs-demo and make seeds-demo in one checkout: an analysis and a seed
    experiment sharing one cache, run in the folder of the finished critical-batch experiment, leave
    every configuration finished; a configuration that would prepare the shared cache otherwise is
    refused at start-up and deletes nothing."""
    path, _ = experiment
    run = {**RUN, "data": {**RUN["data"], "cache": "cache/demo"}}
    run["training"] = {**RUN["training"], "tokens": 512, "epochs": 2}
    (path / "demo-run.yaml").write_text(yaml.safe_dump(run))
    settings = {"noise_samples": 2, "random_samples": 2, "device": "cpu", "dtype": "float64"}
    demo = {
        "train_runs": {"demo": {"config": "demo-run.yaml", "shard_tokens": 256}},
        "analyses": {"demo": {"run": "runs/demo", "cases": ["seen"], "settings": settings}},
    }
    seeds = {"config": "demo-run.yaml", "shard_tokens": 256, "seeds": [1, 2], "controls": [], "settings": SEED_SETTINGS}
    configs = {
        "demo.yaml": demo,
        "seeds.yaml": {"train_runs": {}, "analyses": {}, "seed_experiments": {"seeds": seeds}},
        "other.yaml": {"train_runs": {}, "analyses": {}, "seed_experiments": {"seeds": {**seeds, "shard_tokens": 64}}},
    }
    for name, config in configs.items():
        (path / name).write_text(yaml.safe_dump(config))
    for name in ("demo.yaml", "seeds.yaml"):
        done = _snakemake(path, configfile=name)
        assert done.returncode == 0, done.stderr[-4000:]
    for name in ("config.yaml", "demo.yaml", "seeds.yaml"):
        assert "Nothing to be done" in _snakemake(path, "-n", configfile=name).stdout, name
    refused = _snakemake(path, configfile="other.yaml")
    assert refused.returncode != 0 and "seed_experiments.seeds: data.cache cache/demo was prepared with other " in (
        refused.stderr
    )
    assert (path / "cache/demo.prepared.json").exists()
    assert "Nothing to be done" in _snakemake(path, "-n", configfile="demo.yaml").stdout
