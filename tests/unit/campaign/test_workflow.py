"""The workflow's decisions as plain functions of its configuration (no Snakemake run): runs and
seed experiments, targets, walltimes, the calibration-first order, the cost line, re-attaching."""

import json
import re
from pathlib import Path

import pytest
import yaml
from workflow_plans import RUN, SETTINGS, plan_config

from tiny_llm.campaign.workflow import WorkflowPlan


def test_runs_trained_here_write_interval_checkpoints_and_share_caches(workflow_project):
    plan = WorkflowPlan(plan_config())
    assert plan.run_configs["tiny"].training.checkpoint_policy == "interval"
    assert plan.runs.cache_of_run == {"tiny": "tiny"} and plan.runs.run_of_cache == {"tiny": "tiny"}
    assert plan.trained_here("gpu") == "tiny" and plan.run_ready("gpu") == "runs/tiny/trained.json"
    assert plan.calibration_inputs("gpu") == []  # calibration needs only the shapes, not the trained run
    spec = plan.runs.cache_spec("tiny")
    assert spec["data"]["seed"] == 7 and spec["shard_tokens"] == 64 and spec["capacity"] > 0
    with pytest.raises(ValueError, match="train_runs.bad: data.cache must be cache/<name>"):
        Path("bad.yaml").write_text(yaml.safe_dump({**RUN, "data": {**RUN["data"], "cache": "elsewhere/x"}}))
        WorkflowPlan({"train_runs": {"bad": {"config": "bad.yaml"}}})


def test_a_cache_prepared_for_other_settings_is_refused_at_start_up_and_its_receipt_kept(workflow_project):
    """Another configuration's run on the same cache/<name> (the demos side by side) is refused by key
    before any job, so Snakemake never deletes the receipt the finished configuration relies on."""
    plan = WorkflowPlan(plan_config())
    receipt = Path("cache/tiny.prepared.json")
    receipt.parent.mkdir()
    receipt.write_text(json.dumps({"cache": "cache/tiny", "spec": plan.runs.cache_spec("tiny")}))
    WorkflowPlan(plan_config())  # the same settings: reused
    receipt.write_text(json.dumps({"cache": "cache/tiny", "spec": {**plan.runs.cache_spec("tiny"), "shard_tokens": 1}}))
    with pytest.raises(ValueError, match=r"^train_runs.tiny: data.cache cache/tiny was prepared with other settings "
                       r"\(shard_tokens; cache/tiny.prepared.json\); name another cache/<name>"):  # fmt: skip
        WorkflowPlan(plan_config())
    assert receipt.exists()
    receipt.write_text(json.dumps({"cache": "cache/tiny"}))  # an older receipt, without its spec
    WorkflowPlan(plan_config())


def test_hf_checkpoint_lists_are_imported_then_measured_on_the_offset_case(workflow_project):
    """An analysis's hf_checkpoints: the plan knows the run's shape, the states and the case before
    the import, waits for the import's receipt, and refuses by key what cannot work (before any
    import or cache is made: a case that needs training's order, an engine the model has no rules
    for, a cache tokenizer with more ids than the model)."""
    import transformers

    for step in (1, 2):
        transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=256, n_embd=8, n_layer=1, n_head=2, n_positions=16)
        ).save_pretrained(f"hf/step{step}")
    checkpoints = [{"path": "hf/step1", "step": 1}, {"path": "hf/step2", "step": 2, "tokens": 64}]
    entry = {"hf_checkpoints": checkpoints, "config": "run.yaml", "settings": {**SETTINGS, "device": "cpu"}}
    plan = WorkflowPlan({"analyses": {"suite": dict(entry)}})
    assert plan.run_ready("suite") == "runs/suite/imported.json" and plan.cases("suite") == ["offset"]
    assert plan.run_config("suite").model.architecture == "gpt2" and plan.runs.imported_runs == ["suite"]
    assert plan.runs.import_spec("suite")["steps"] == [1, 2] and plan.runs.import_spec("suite")["tokens"] == [None, 64]
    assert plan.runs.import_inputs("suite") == ["hf/step1/config.json", "hf/step2/config.json"]
    assert plan.costs.expected_states("suite", plan.run_config("suite")) == (2, "hf_checkpoints")
    from hf_suites import corpus_text, train_tokenizer

    train_tokenizer(Path("tokenizer"), corpus_text(), vocab_size=300)  # more ids than the model's 256
    for change, message in [
        ({"cases": ["offset", "seen"]}, "analyses.suite.cases: seen needs the batches training took"),
        (
            {"adapter": True, "settings": {**entry["settings"], "engine": "adjoint"}},
            "analyses.suite.settings.engine: engine adjoint: the taylor and adjoint engines need second-order rules",
        ),
        (
            {"cache_tokenizer": "tokenizer"},
            "analyses.suite.cache_tokenizer: tokenizer's vocabulary (300 tokens) exceeds the model's vocab_size 256",
        ),
        ({"run": "elsewhere/suite"}, "analyses.suite.run: the workflow imports hf_checkpoints into runs/<name>"),
        ({"config": None}, "analyses.suite.config: hf_checkpoints need a run configuration"),
        (
            {"hf_checkpoints": [{"path": "hf/missing"}]},
            "analyses.suite.hf_checkpoints: hf/missing is not a local directory",
        ),
        (
            {"hf_checkpoints": checkpoints[::-1]},
            "analyses.suite.hf_checkpoints: checkpoints out "
            "of training order: hf/step1 (step 1) comes after hf/step2 (step 2)",
        ),
        (
            {"hf_checkpoints": [checkpoints[0], {**checkpoints[1], "step": 1}]},
            "analyses.suite.hf_checkpoints: checkpoints out of training order",
        ),
        (
            {"hf_checkpoints": [checkpoints[0], {**checkpoints[0], "path": "hf/../hf/step1"}]},
            "analyses.suite.hf_checkpoints: checkpoint directory hf/../hf/step1 is given twice",
        ),
        (
            {"hf_checkpoints": [{"path": "hf/step1"}, {"path": "hf/step2"}]},
            "analyses.suite.hf_checkpoints: hf/step1: its training step is unknown",
        ),
    ]:
        bad = {k: v for k, v in {**entry, **change}.items() if v is not None}
        with pytest.raises(ValueError, match=re.escape(message)):
            WorkflowPlan({"analyses": {"suite": bad}})
    with pytest.raises(ValueError, match="analyses.tiny.run: runs/tiny is trained by train_runs.tiny"):
        WorkflowPlan(
            {"train_runs": {"tiny": {"config": "run.yaml"}}, "analyses": {"tiny": {**entry, "run": "runs/tiny"}}}
        )


def test_the_seeds_of_an_imported_experiment_are_own_folders_of_one_shape_at_the_same_steps(workflow_project):
    """Seeds trained elsewhere are compared parameter by parameter at equal steps: a folder listed
    for two seeds, another architecture or shape, other steps or another count are refused by key."""
    import transformers
    from hf_suites import corpus_text, train_tokenizer

    tokenizer = train_tokenizer(Path("tokenizer"), corpus_text())
    for folder, width in (("s1", 8), ("s2", 8), ("wide", 16)):
        for step in (1, 2, 3):
            transformers.GPT2LMHeadModel(
                transformers.GPT2Config(vocab_size=300, n_embd=width, n_layer=1, n_head=2, n_positions=16)
            ).save_pretrained(f"hf/{folder}/step{step}")
            tokenizer.save_pretrained(f"hf/{folder}/step{step}")

    def seeds(second, first=("s1", (1, 2))):
        lists = {
            seed: [{"path": f"hf/{folder}/step{step}", "step": step} for step in steps]
            for seed, (folder, steps) in ((1, first), (2, second))
        }
        return {"seed_experiments": {"poly": {"hf_checkpoints": lists, "config": "run.yaml"}}}

    WorkflowPlan(seeds(("s2", (1, 2))))
    key = "seed_experiments.poly.hf_checkpoints.2: "
    for second, message in (
        (("s1", (1, 2)), key + "hf/s1/step1 is listed for seed 1 too; each seed's checkpoints are its own folders"),
        (("wide", (1, 2)), key + "its model (gpt2, d_model 16, 1 layers, 2 heads, vocabulary 300) is not the first"),
        (("s2", (1, 3)), key + "its checkpoints are at steps [1, 3], the first seed's at [1, 2]"),
        (("s2", (1, 2, 3)), key + "its checkpoints are at steps [1, 2, 3], the first seed's at [1, 2]"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            WorkflowPlan(seeds(second))


def test_what_cannot_run_here_is_refused_at_start_up_by_key(workflow_project, monkeypatch):
    """Local ranks beyond the usable cores, several nodes without Slurm, a tokenizer directory that
    is not one, a sharded spectrum with another HVP engine: each refused naming its key."""
    import os

    cpu = {
        "train_runs": {"tiny": {"config": "run.yaml"}},
        "analyses": {"local": {"run": "runs/tiny", "settings": {**SETTINGS, "device": "cpu"}}},
    }

    def with_analysis(**changes):
        return {**cpu, "analyses": {"local": {**cpu["analyses"]["local"], **changes}}}

    usable = len(os.sched_getaffinity(0))
    with pytest.raises(
        ValueError,
        match=rf"analyses.local.gpus_per_job: {usable + 1} ranks per job, but this machine "
        rf"has {usable} usable CPU cores",
    ):
        WorkflowPlan(with_analysis(gpus_per_job=usable + 1)).check_devices(False, ["local"])
    WorkflowPlan(with_analysis(gpus_per_job=usable)).check_devices(False, ["local"])
    with pytest.raises(
        ValueError, match=r"analyses.local.gpus_per_job: 8 GPUs per node, but a node has 4 \(cluster.gpus_per_node\)"
    ):
        WorkflowPlan({**with_analysis(gpus_per_job=8), "cluster": {"gpus_per_node": 4}})
    WorkflowPlan({**with_analysis(gpus_per_job=4, nodes_per_job=2), "cluster": {"gpus_per_node": 4}})
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    with pytest.raises(ValueError, match="analyses.local.nodes_per_job: 2 nodes need a Slurm allocation"):
        WorkflowPlan(with_analysis(nodes_per_job=2)).check_devices(False, ["local"])
    with pytest.raises(ValueError, match=r"analyses.local.settings.sharded: true shards the model over a job's ranks"):
        WorkflowPlan(with_analysis(settings={**SETTINGS, "device": "cpu", "sharded": True}))
    WorkflowPlan(with_analysis(settings={**SETTINGS, "device": "cpu", "sharded": True}, gpus_per_job=2))
    with pytest.raises(ValueError, match="analyses.local.spectrum.sharded: the products engines that run on a sharded"):
        WorkflowPlan(
            with_analysis(
                settings={**SETTINGS, "device": "cpu", "engine": "double_backward"},
                spectrum={"enabled": True, "sharded": True},
            )
        )
    for directory, message in [("nowhere", "nowhere is not a local directory"), (".", ". has no tokenizer.json")]:
        with pytest.raises(ValueError, match=re.escape(f"train_runs.tiny.cache_tokenizer: {message}")):
            WorkflowPlan({**cpu, "train_runs": {"tiny": {"config": "run.yaml", "cache_tokenizer": directory}}})
