"""The workflow's decisions as plain functions of its configuration (no Snakemake run): runs and
seed experiments, targets, walltimes, the calibration-first order, the cost line, re-attaching."""

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from tiny_llm.campaign.checks import expand_seed_experiments, expand_seed_imports, typed_profile_values
from tiny_llm.campaign.plan import estimate_seconds, job_minutes
from tiny_llm.campaign.slurm_jobs import EarlierJob, awaited_outputs, sort_earlier_jobs
from tiny_llm.campaign.targets import all_targets
from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.config import config_from_dict
from tiny_llm.layout import AUDIT_FIGURES, FIGURES, SPECTRUM_FIGURES
from tiny_llm.workers.settings import settings_from_dict

RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/tiny", "seq_len": 16, "shuffle_group_blocks": 4, "seed": 7},
    "training": {"batch_size": 4, "micro_batch_size": 2, "tokens": 512, "epochs": 2},
}
SETTINGS = {"noise_samples": 2, "random_samples": 2, "directions_per_pass": 4}
SECONDS = {"startup": 120.0, "gradient_microbatch": 0.5, "hvp_microbatch_pass": 40.0}
KEY = {
    "d_model": 8,
    "n_layers": 1,
    "n_heads": 2,
    "d_ff": 16,
    "vocab_size": 256,
    "seq_len": 16,
    "batch_size": 4,
    "micro_batch_size": 2,
    "hvp_batch_size": 2,
    "directions_per_pass": 4,
    "dtype": "float32",
    "amp": False,
    "tf32": True,
    "engine": "adjoint",
    "compile_hvp": True,
    "device_kind": "cuda:NVIDIA GH200 480GB",
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project directory with a run configuration and a timing entry for its GPU analysis."""
    monkeypatch.chdir(tmp_path)
    Path("run.yaml").write_text(yaml.safe_dump(RUN))
    Path("timing.json").write_text(json.dumps({"entries": [{"key": KEY, "seconds": SECONDS}]}))
    return tmp_path


def _config(cluster=None, **analysis):
    return {
        "train_runs": {"tiny": {"config": "run.yaml", "shard_tokens": 64}},
        "analyses": {
            "gpu": {"run": "runs/tiny", "settings": {**SETTINGS, "device": "cuda", "dtype": "float32"}, **analysis}
        },
        "cluster": {"timing_profiles": ["timing.json"], **(cluster or {})},
    }


def test_runs_trained_here_write_interval_checkpoints_and_share_caches(project):
    plan = WorkflowPlan(_config())
    assert plan.run_configs["tiny"].training.checkpoint_policy == "interval"
    assert plan.runs.cache_of_run == {"tiny": "tiny"} and plan.runs.run_of_cache == {"tiny": "tiny"}
    assert plan.trained_here("gpu") == "tiny" and plan.run_ready("gpu") == "runs/tiny/trained.json"
    assert plan.calibration_inputs("gpu") == []  # calibration needs only the shapes, not the trained run
    spec = plan.runs.cache_spec("tiny")
    assert spec["data"]["seed"] == 7 and spec["shard_tokens"] == 64 and spec["capacity"] > 0
    with pytest.raises(ValueError, match="train_runs.bad: data.cache must be cache/<name>"):
        Path("bad.yaml").write_text(yaml.safe_dump({**RUN, "data": {**RUN["data"], "cache": "elsewhere/x"}}))
        WorkflowPlan({"train_runs": {"bad": {"config": "bad.yaml"}}})


def test_seed_experiments_expand_to_seed_and_control_runs(project):
    runs, roles = expand_seed_experiments(
        {"exp": {"config": "run.yaml", "seeds": [3, 5], "set": {"training.lr": 0.01}}}, {}, {}
    )
    assert roles == {
        "exp": {
            "exp-seed-3": "seed",
            "exp-seed-5": "seed",
            "exp-same-seed": "same-seed",
            "exp-data-order": "data-order",
        }
    }
    assert runs["exp-seed-5"]["set"] == {
        "training.lr": 0.01,
        "training.checkpoint_policy": "interval",
        "training.seed": 5,
    }
    assert runs["exp-same-seed"]["set"]["training.seed"] == 3
    assert runs["exp-data-order"]["set"]["data.seed"] == 8  # the run configuration's data seed + 1
    only_seeds, _ = expand_seed_experiments({"exp": {"config": "run.yaml", "seeds": [1, 2], "controls": []}}, {}, {})
    assert sorted(only_seeds) == ["exp-seed-1", "exp-seed-2"]
    with pytest.raises(ValueError, match="seed_experiments.exp: an analysis has the same name"):
        expand_seed_experiments({"exp": {"config": "run.yaml", "seeds": [1, 2]}}, {}, {"exp": {}})
    with pytest.raises(ValueError, match="seed_experiments.exp trains runs/exp-seed-1, which train_runs also names"):
        expand_seed_experiments({"exp": {"config": "run.yaml", "seeds": [1, 2]}}, {"exp-seed-1": {}}, {})
    with pytest.raises(ValueError, match=r"seed_experiments.exp.settings: .*top_k"):
        expand_seed_experiments({"exp": {"config": "run.yaml", "seeds": [1, 2], "settings": {"top_k": 0}}}, {}, {})
    with pytest.raises(ValueError, match=r"seed_comparisons.c: \['nope'\] are not seed_experiments"):
        WorkflowPlan({"seed_comparisons": {"c": {"experiments": ["nope"]}}})


def test_seed_experiments_of_models_trained_elsewhere_expand_to_one_import_per_seed():
    """hf_checkpoints (seed -> list): one import per seed into runs/<name>-seed-<seed>, the first
    preparing the shared cache (text by default), no controls; bad entries refused by key."""
    lists = {1: [{"path": "a/step0"}, {"path": "a/step9"}], 2: [{"path": "b/step0"}, {"path": "b/step9"}]}
    entry = {"config": "run.yaml", "hf_checkpoints": lists, "cache_inputs": ["t.txt"], "cache_source": "demo"}
    imports, roles = expand_seed_imports({"poly": {**entry, "controls": ["same-seed", "data-order"]}}, {}, {})
    assert roles == {"poly": {"poly-seed-1": "seed", "poly-seed-2": "seed"}}
    assert imports["poly-seed-1"]["cache_inputs"] == ["t.txt"] and imports["poly-seed-1"]["cache_source"] == "text"
    assert "cache_inputs" not in imports["poly-seed-2"] and imports["poly-seed-2"]["run"] == "runs/poly-seed-2"
    assert imports["poly-seed-2"]["hf_checkpoints"] == lists[2]
    assert expand_seed_experiments({"poly": entry}, {}, {}) == ({}, {})  # nothing to train
    for changes, message in (
        ({"seeds": [1, 2]}, "seeds (trained here) and hf_checkpoints (trained elsewhere) exclude each other"),
        ({"controls": ["same-seed"]}, "seed_experiments.poly.controls: controls are trained here"),
        ({"hf_checkpoints": {1: lists[1]}}, "seed_experiments.poly.hf_checkpoints: expected two or more seeds"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            expand_seed_imports({"poly": {**entry, **changes}}, {}, {})
    with pytest.raises(ValueError, match="seed_experiments.poly: an analysis has the same name"):
        expand_seed_imports({"poly": entry}, {}, {"poly": {}})
    with pytest.raises(ValueError, match="seed_experiments.poly: give seeds"):
        expand_seed_experiments({"poly": {"config": "run.yaml"}}, {}, {})


def test_targets_name_every_figure_and_every_indexed_result(project):
    plan = WorkflowPlan(_config(spectrum={"enabled": True}))
    targets = all_targets(plan.campaign, plan.walltimes)
    assert targets[0] == "runs/tiny/trained.json"
    assert {"results/gpu/manifest.json", "results/gpu/summary.csv", "results/gpu/spectrum.csv"} <= set(targets)
    assert all(
        f"results/gpu/figures/{f}.{ext}" in targets
        for f in FIGURES + AUDIT_FIGURES + SPECTRUM_FIGURES
        for ext in ("pdf", "png")
    )
    exact = WorkflowPlan(_config(settings={**SETTINGS, "device": "cpu", "dtype": "float64"}))
    exact = all_targets(exact.campaign, exact.walltimes)
    assert "results/gpu/figures/loss.png" in exact and not any("precision_audit" in t for t in exact)  # no audit
    assert not any("/states/" in t for t in targets)  # before the index: the figures pull the results in
    Path("results/gpu").mkdir(parents=True)
    Path("results/gpu/states.json").write_text(json.dumps({"states": [{"key": "a" * 64}, {"key": "b" * 64}]}))
    indexed = WorkflowPlan(_config())
    results = [t for t in all_targets(indexed.campaign, indexed.walltimes) if "/states/" in t]
    assert results == [f"results/gpu/states/{k * 64}/{case}.json" for k in "ab" for case in ("seen", "unseen")]
    assert plan.state_results("gpu", "k") == [
        "results/gpu/states/k/seen.json",
        "results/gpu/states/k/unseen.json",
        "results/gpu/spectra/k/seen.json",
        "results/gpu/spectra/k/unseen.json",
    ]
    state = {"aliases": [{"file": "epoch-002.safetensors"}, {"file": "final.pt"}]}
    assert plan.state_checkpoint("gpu", state) == "runs/tiny/epoch-002.safetensors"


def test_walltimes_from_the_timing_entry_complete_the_group_to_the_hour(project):
    plan = WorkflowPlan(_config({"walltime": "estimate", "gpu_kind": "GH200"}))
    work = estimate_seconds(
        config_from_dict({**RUN, "training": {**RUN["training"], "checkpoint_policy": "interval"}}),
        settings_from_dict({**SETTINGS, "device": "cuda", "dtype": "float32"}),
        SECONDS,
    )
    assert plan.walltimes.case_work_seconds("gpu") == work
    assert plan.walltimes.analyze_runtime("gpu") == math.ceil(2 * work / 60)
    assert 2 * plan.walltimes.analyze_runtime("gpu") + plan.walltimes.finish_runtime("gpu") == job_minutes(2 * work)
    assert not plan.walltimes.calibration_pending("gpu") and plan.walltimes.calibration("gpu") == []
    assert "GPU-hours requested" in plan.costs.cost_line("gpu")


def test_the_campaign_line_counts_training_calibration_and_analyses(project):
    """Under a cluster walltime rule the dry run totals every GPU-hour asked for: the training job's
    walltime, the calibration jobs' and the analyses' state jobs; a local run prints no total."""
    plan = WorkflowPlan(_config({"walltime": "estimate", "gpu_kind": "GH200"}))
    hours = 3 * job_minutes(2 * plan.walltimes.case_work_seconds("gpu")) / 60  # 3 states (initialisation + 2 epochs)
    assert plan.costs.cost_lines(1440, 60)[-1] == (
        f"campaign on Slurm: training 1 run(s) × 24 h + analyses {hours:g} "
        f"GPU-hours = at most {24 + hours:g} GPU-hours requested"
    )
    pending = WorkflowPlan(_config({"walltime": "estimate", "gpu_kind": "A100"}))  # calibrates first
    assert pending.costs.campaign_line(1440, 60) == (
        "campaign on Slurm: training 1 run(s) × 24 h + calibration 1 job(s) "
        "× 1 h = at most 25 GPU-hours requested (+ gpu: priced by its "
        "calibration)"
    )
    assert WorkflowPlan(_config()).costs.campaign_line(1440, 60) is None
    Path("runs/tiny").mkdir(parents=True)
    Path("runs/tiny/trained.json").write_text("{}")  # trained already: not asked for again
    assert plan.costs.campaign_line(1440, 60).startswith(f"campaign on Slurm: analyses {hours:g} GPU-hours")


def test_a_seed_experiment_prints_its_cost(project):
    config = {
        "seed_experiments": {"exp": {"config": "run.yaml", "seeds": [1, 2], "settings": {"device": "cpu"}}},
        "cluster": {"timing_profiles": ["timing.json"]},
    }
    line = WorkflowPlan(config).costs.cost_lines()[0]
    # 2 seeds and the 2 controls, each with the initialisation and 2 epochs measured.
    assert line.startswith(
        "seed experiment exp: 4 runs (seeds and controls) trained, 12 checkpoint measurements; each: "
    ) and line.endswith("time: no timing entry for this setup on cpu")


def test_an_uncovered_setup_calibrates_first(project):
    plan = WorkflowPlan(_config({"walltime": "estimate", "gpu_kind": "A100"}))  # no A100 entry
    assert plan.walltimes.calibration_pending("gpu") and plan.walltimes.calibration("gpu") == [
        "results/timing/gpu.json"
    ]
    assert "results/timing/gpu.json" in all_targets(plan.campaign, plan.walltimes)
    with pytest.raises(ValueError, match="no timing profile covers analysis gpu"):
        plan.walltimes.case_work_seconds("gpu")
    assert "from the calibration job, which runs first" in plan.costs.cost_line("gpu")


def test_explicit_walltime_is_split_over_the_state_job(project):
    plan = WorkflowPlan(_config({"walltime_hours": 2}))
    assert (plan.walltimes.analyze_runtime("gpu"), plan.walltimes.finish_runtime("gpu")) == (59, 2)  # 2 × 59 + 2 = 120
    assert plan.walltimes.rule() == "cluster.walltime_hours: 2 per state job"
    one_case = WorkflowPlan(_config({"walltime_hours": 1}, cases=["seen"]))
    assert (one_case.walltimes.analyze_runtime("gpu"), one_case.walltimes.finish_runtime("gpu")) == (59, 1)
    local = WorkflowPlan(_config())
    assert (local.walltimes.analyze_runtime("gpu"), local.walltimes.finish_runtime("gpu")) == (60, 5)


def test_profile_values_are_typed_before_validation():
    config = {
        "cluster": {"walltime_hours": "12", "walltime": "estimate"},
        "settings_override": {"amp": "True"},
        "analyses": {"a": {"run": "64"}},
    }
    typed_profile_values(config)
    assert config["cluster"] == {"walltime_hours": 12, "walltime": "estimate"}
    assert config["settings_override"] == {"amp": True} and config["analyses"] == {"a": {"run": "64"}}


def test_earlier_jobs_are_awaited_cancelled_or_waited_for():
    state = ("analyze_state", (("analysis", "gpu"), ("case", "seen"), ("key", "k")))
    receipt = ("finish_state", (("analysis", "gpu"), ("key", "k")))
    other = ("analyze_state", (("analysis", "other"), ("case", "seen"), ("key", "k")))
    jobs = [
        EarlierJob("1", "RUNNING", (state, receipt)),
        EarlierJob("2", "PENDING", (state,)),
        EarlierJob("3", "RUNNING", (("train_run", (("run", "tiny"),)),)),
        EarlierJob("4", "RUNNING", (other,)),
    ]
    awaited = awaited_outputs(jobs, ["gpu"])
    assert awaited == {"results/gpu/states/k/seen.json": "1", "results/gpu/states/k/done.json": "1"}
    needed = {state, receipt, ("train_run", (("run", "tiny"),))}
    assert sort_earlier_jobs(jobs, needed, awaited) == (["2"], ["1"], ["3"])
    assert sort_earlier_jobs(jobs, set(), awaited) == ([], [], [])  # nothing this run needs: left alone


def test_the_plan_states_the_memory_of_each_job_and_refuses_one_that_cannot_fit(project):
    """The cost line names the predicted peak and the grouping under the budget; a budget below
    one sequence is refused while planning, naming the analysis and the setting."""
    budgeted = _config(settings={**SETTINGS, "device": "cuda", "dtype": "float32", "memory_budget_gb": 0.01})
    line = WorkflowPlan(budgeted).costs.cost_line("gpu")
    assert "memory: predicted peak ~" in line and "budget 10.2 MiB" in line and "forms " in line
    default = WorkflowPlan(_config()).costs.cost_line("gpu")
    assert "budget: the GPU's free memory at run time, cut to fit" in default
    tiny = _config(settings={**SETTINGS, "device": "cuda", "dtype": "float32", "memory_budget_gb": 1e-5})
    with pytest.raises(
        ValueError,
        match=r"analyses.gpu.settings: gradient: one sequence of 16 tokens needs ~.* "
        r"more than memory_budget_gb = 10.5 KiB; lower data.seq_len",
    ):
        WorkflowPlan(tiny)


def test_hf_checkpoint_lists_are_imported_then_measured_on_the_offset_case(project):
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


def test_the_seeds_of_an_imported_experiment_are_own_folders_of_one_shape_at_the_same_steps(project):
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


def test_what_cannot_run_here_is_refused_at_start_up_by_key(project, monkeypatch):
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
