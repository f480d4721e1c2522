"""A critical-batch-size experiment planned into ordinary parts: the base run keeping its states,
one branch run per (checkpoint, batch size, data seed) waiting for it, the analysis of the base
run at the checkpoints, the targets and the price; and every entry that cannot run refused by key."""

import dataclasses
import math
import re
from pathlib import Path

import pytest
import yaml

from tiny_llm.campaign.cbs import CbsExperiment, expand_cbs_experiments, parent_receipt
from tiny_llm.campaign.targets import all_targets
from tiny_llm.campaign.workflow import WorkflowPlan

RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/cbs", "seq_len": 16, "shuffle_group_blocks": 4},
    "training": {"batch_size": 4, "micro_batch_size": 2, "tokens": 4 * 16 * 16 * 4, "epochs": 4, "lr": 0.01},
}
ENTRY = {
    "config": "run.yaml",
    "checkpoints": [2, 1],
    "batch_sizes": [2, 4, 8],
    "token_budget": 4 * 8 * 16,
    "eval_sequences": 16,
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(RUN))
    return tmp_path


def _config(**changes):
    return {"train_runs": {}, "analyses": {}, "cbs_experiments": {"x": {**ENTRY, **changes}}}


def test_an_experiment_is_a_base_run_its_branches_and_an_analysis(project):
    config, plans = expand_cbs_experiments(_config(data_seeds=[5, 6]))
    runs, plan = config["train_runs"], plans["x"]
    assert len(runs) == 1 + 2 * 3 * 2 and plan.epochs == (1, 2)
    assert runs["x-base"]["set"] == {
        "data.cache": "cache/x",
        "training.checkpoint_policy": "interval",
        "training.keep_states": [1, 2],
    }  # each experiment its own cache, whatever the run configuration names
    assert {entry["set"]["data.cache"] for entry in runs.values()} == {"cache/x"}
    branch = runs["x-e002-b8-s6"]["set"]
    assert branch["training.init_from"] == "runs/x-base/state-002.pt" and branch["data.seed"] == 6
    # seed 6 reads the second region of whole shuffle groups after the 2 × 16 × 4 sequences trained
    assert branch["training.batch_size"] == 8 and branch["data.stream_offset"] == 2 * 16 * 4 + 32
    assert runs["x-e002-b2-s5"]["set"]["data.stream_offset"] == 2 * 16 * 4  # every batch size: the same region
    assert parent_receipt(runs, "x-e002-b8-s6") == ["runs/x-base/trained.json"] and parent_receipt(runs, "x-base") == []
    assert config["analyses"]["x"] == {
        "run": "runs/x-base",
        "checkpoints": ["epoch-001.safetensors", "epoch-002.safetensors"],
        "cases": ["unseen"],
        "settings": {},
    }
    steps = {info["batch_size"]: info["steps"] for info in plan.branches[1].values()}
    assert steps == {2: 16, 4: 8, 8: 4}
    assert {info["points"] for info in plan.branches[1].values()} == {4}  # a loss at every quarter
    rates = {info["batch_size"]: info["lr"] for info in plan.branches[1].values()}
    assert rates[8] == pytest.approx(rates[2] * 2)  # Adam: √(8/2)
    spec = plan.evaluation("epoch-001", "cpu")
    assert (spec["step"], spec["tokens"], len(spec["blocks"])) == (16, 16 * 4 * 16, 16)
    assert spec["state"] == "runs/x-base/state-001.pt" and spec["token_budget"] == 512
    assert plan.receipts("epoch-002")[0] == "runs/x-e002-b2-s5/trained.json"


def test_the_plan_runs_it_prices_it_and_targets_its_table(project):
    plan = WorkflowPlan(_config())
    assert "x-e001-b2-s1" in plan.run_configs and "x" in plan.analyses
    assert plan.run_configs["x-e001-b2-s1"].training.init_from == "runs/x-base/state-001.pt"
    targets = all_targets(plan.campaign, plan.walltimes)
    assert {"results/x/cbs.csv", "results/x/figures/critical_batch.png", "runs/x-e002-b8-s3/trained.json"} <= set(
        targets
    )
    line = next(line for line in plan.costs.cost_lines() if line.startswith("cbs experiment x"))
    assert "2 checkpoints × 3 batch sizes (2, 4, 8 sequences) × 3 data seeds = 18 branch runs" in line
    assert "of 512 tokens (9,216 tokens in all, 2.25 × the base run's 4,096), 16 to 4 steps" in line
    assert "case unseen" in line
    assert "Adam's memory −1/ln β2 by batch: 2: 19.5 steps = 624 tokens, 4: 19.5 steps = 1,248 tokens" in "".join(
        plan.costs.cost_lines()
    )
    seeds = next(line for line in plan.costs.cost_lines() if "paired comparison" in line)
    assert "Merrill's rule makes 1 paired comparison, each bound at 97.5 % one-sided (95 % jointly)" in seeds
    assert "at a paired spread of 0.005 nats (cbs_experiments.x.paired_spread) ε = 0.01 needs" in seeds
    (warning,) = [line for line in plan.costs.cost_lines() if line.startswith("warning: ")]
    assert warning.startswith("warning: cbs_experiments.x.token_budget: the largest batch's branches train 4 steps")
    assert warning.endswith("raise token_budget to 7,680 or more")  # 60 steps of 8, whole quarters of 8
    forgetful = WorkflowPlan(_config(set={"training.beta2": 0.2}))  # a memory of 1.25 steps
    assert not [line for line in forgetful.costs.cost_lines() if line.startswith("warning: ")]


def test_the_rate_grid_trains_every_rate_at_every_checkpoint(project):
    config, plans = expand_cbs_experiments(_config(lr_factors=[0.5, 1, 2], data_seeds=[1, 2]))
    runs, plan = config["train_runs"], plans["x"]
    assert len(runs) == 1 + 2 * 3 * 2 * 3  # base, then every checkpoint × batch × seed × rate
    rule = runs["x-e001-b4-s2"]["set"]["training.lr"]
    assert runs["x-e001-b4-s2-lr0.5"]["set"]["training.lr"] == pytest.approx(rule / 2)
    assert runs["x-e002-b4-s2-lr2"]["set"]["training.lr"] == pytest.approx(
        2 * runs["x-e002-b4-s2"]["set"]["training.lr"]
    )
    assert plan.branches[1]["x-e001-b8-s1-lr2"]["lr_factor"] == 2 and plan.branches[2]["x-e002-b8-s1"]["lr_factor"] == 1
    line = plan.cost_lines()[0]
    assert "× 3 learning rates (0.5, 1, 2 × the rule's) × 2 data seeds = 36 branch runs of 512 tokens" in line


def test_the_optimizers_memory_in_tokens_is_the_same_at_every_batch(project):
    """optimizer_memory: tokens raises β1 and β2 to the power B'/B: the decay per token, and so the
    memory in tokens, is the base run's at every batch; steps keeps the base run's β's."""
    config, plans = expand_cbs_experiments(_config(optimizer_memory="tokens", set={"training.beta2": 0.9}))
    runs, plan = config["train_runs"], plans["x"]
    for batch in (2, 4, 8):
        branch = runs[f"x-e001-b{batch}-s1"]["set"]
        assert branch["training.beta2"] == pytest.approx(0.9 ** (batch / 4))
        assert branch["training.beta1"] == pytest.approx(0.9 ** (batch / 4))
        assert plan.branches[1][f"x-e001-b{batch}-s1"]["beta2"] == branch["training.beta2"]
    assert [tokens for _, tokens in plan.memory.values()] == pytest.approx([-64 / math.log(0.9)] * 3)
    kept = expand_cbs_experiments(_config())[0]["train_runs"]["x-e001-b8-s1"]["set"]
    assert (kept["training.beta1"], kept["training.beta2"]) == (0.9, 0.95)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch_sizes": [4, 2]}, "cbs_experiments.x.batch_sizes: list two or more, ascending, got [4, 2]"),
        ({"data_seeds": []}, "cbs_experiments.x.data_seeds: list two or more distinct data orders"),
        ({"data_seeds": [1]}, "cbs_experiments.x.data_seeds: list two or more distinct data orders"),
        ({"data_seeds": [1, 1]}, "cbs_experiments.x.data_seeds: list two or more distinct data orders"),
        ({"checkpoints": []}, "cbs_experiments.x.checkpoints: list one or more epochs to branch from"),
        ({"checkpoints": [4]}, "cbs_experiments.x.checkpoints: epoch 4 is not one to branch from"),
        ({"token_budget": 256}, "cbs_experiments.x.token_budget: 256 is not a whole number of quarters"),
        ({"token_budget": 4 * 8 * 16 * 2}, "3 data seeds of 1024 tokens each from epoch 2 would read to sequence 320"),
        ({"batch_sizes": [1, 2]}, "cbs_experiments.x.batch_sizes: [1, 2] leaves out the base run's batch 4"),
        ({"eval_sequences": 65}, "cbs_experiments.x.eval_sequences: 65 held-out sequences asked for"),
        ({"lr_rule": "cubic"}, "cbs_experiments.x.lr_rule"),
        ({"lr_factors": [0.5, 2]}, "cbs_experiments.x.lr_factors: list the multiples of the rule's rate to train"),
        ({"lr_factors": [0.5, 1]}, "cbs_experiments.x.lr_factors: list the multiples of the rule's rate to train"),
        ({"lr_factors": [1, 1, 2]}, "cbs_experiments.x.lr_factors: list the multiples of the rule's rate to train"),
        (
            {"optimizer_memory": "tokens", "set": {"training.optimizer": "sgd"}},
            "cbs_experiments.x.optimizer_memory: tokens scales Adam's β1 and β2",
        ),
        ({"set": {"training.keep_states": [3]}}, "cbs_experiments.x.set: training.keep_states is the experiment's"),
        ({"paired_spread": 0}, "cbs_experiments.x.paired_spread"),
        ({"lr_factors": [-1]}, "cbs_experiments.x.lr_factors"),
        ({"epsilon": 0}, "cbs_experiments.x.epsilon"),
        ({"seeds": [1]}, "unknown key cbs_experiments.x.seeds"),
        ({"settings": {"engine": "magic"}}, "cbs_experiments.x: "),
        ({"set": {"training.packed": {"workers": 2}}}, "cbs_experiments.x.config: a packed run"),
        ({"set": {"data.cache": "elsewhere/c"}}, "cbs_experiments.x.set: data.cache must be cache/<name>"),
    ],
)
def test_an_experiment_that_cannot_run_is_refused_by_key(project, changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        expand_cbs_experiments(_config(**changes))


def test_a_name_taken_twice_is_refused(project):
    with pytest.raises(ValueError, match=r"cbs_experiments.x: analyses.x has the same name"):
        expand_cbs_experiments({**_config(), "analyses": {"x": {}}})
    with pytest.raises(ValueError, match="cbs_experiments.x trains runs/x-base, which train_runs also names"):
        expand_cbs_experiments({**_config(), "train_runs": {"x-base": {}}})
    missing = {"cbs_experiments": {"x": {"config": "run.yaml"}}}
    with pytest.raises(ValueError, match="cbs_experiments.x: give checkpoints, batch_sizes, token_budget"):
        expand_cbs_experiments(missing)


def test_the_docs_state_every_key_and_its_default():
    page = (Path(__file__).resolve().parents[3] / "docs/critical-batch.md").read_text()
    section = page.split("## The keys", 1)[1].splitlines()
    first = next(i for i, line in enumerate(section) if line.startswith("| key |"))
    table = [line for line in section[first + 2 :] if line.startswith("|")][: len(dataclasses.fields(CbsExperiment))]
    documented = {}
    for line in table:
        key, default = (cell.strip().strip("`") for cell in line.strip("|").split("|")[:2])
        documented[key] = None if default in ("(required)", "null") else yaml.safe_load(default)
    fields = {f.name: f.default for f in dataclasses.fields(CbsExperiment)}
    assert set(documented) == set(fields)
    for key, default in fields.items():
        expected = None if default is dataclasses.MISSING else default
        assert documented[key] == (list(expected) if isinstance(expected, tuple) else expected), key
