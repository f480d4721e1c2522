"""The NAISS profile without a cluster: lint, and a dry run that shows GH200 resources and the
walltime computed from a timing profile (2 x work + 30 min, rounded up to the hour)."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from builders import PROJECT, project_view

from tiny_llm.campaign.plan import (
    estimate_seconds,
    finish_minutes,
    group_minutes,
    job_minutes,
    parallel_seconds,
    states_per_job,
)
from tiny_llm.config import config_from_dict
from tiny_llm.workers.settings import settings_from_dict

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/tiny", "seq_len": 16, "shuffle_group_blocks": 4},
    "training": {"batch_size": 4, "micro_batch_size": 3, "tokens": 512, "epochs": 2, "checkpoint_policy": "interval"},
}
SETTINGS = {"noise_samples": 2, "random_samples": 2, "directions_per_pass": 4}
GPU = {"device": "cuda", "dtype": "float32", "tf32": True, "compile_hvp": True, "engine": "auto"}
SECONDS = {"startup": 120.0, "gradient_microbatch": 0.5, "hvp_microbatch_pass": 40.0}


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
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
    )


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """A trained tiny run and the index of a GPU analysis, made locally (no Slurm)."""
    path = tmp_path_factory.mktemp("naiss")
    (path / "run.yaml").write_text(yaml.safe_dump(RUN))
    key = {
        "d_model": 8,
        "n_layers": 1,
        "n_heads": 2,
        "d_ff": 16,
        "vocab_size": 256,
        "seq_len": 16,
        "batch_size": 4,
        "micro_batch_size": 3,
        "hvp_batch_size": 3,
        "directions_per_pass": 4,
        "dtype": "float32",
        "amp": False,
        "tf32": True,
        "engine": "adjoint",
        "compile_hvp": True,
        "device_kind": "cuda:NVIDIA GH200 480GB",
    }
    (path / "timing.json").write_text(json.dumps({"entries": [{"key": key, "seconds": SECONDS}]}))
    config = {
        "train_runs": {"tiny": {"config": str(path / "run.yaml"), "shard_tokens": 64}},
        "analyses": {"gpu": {"run": "runs/tiny", "settings": SETTINGS}},
        "cluster": {"timing_profiles": [str(path / "timing.json")]},
    }
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    local = _snakemake(path, "-c2", "--config", f"settings_override={json.dumps(GPU)}", "--", "results/gpu/states.json")
    assert local.returncode == 0, local.stderr[-3000:]
    return path


def test_dry_run_shows_gh200_resources_and_walltime(indexed):
    # The run was trained here on the CPU; the profile's train_device (cuda) must not plan a retrain.
    plan = _snakemake(indexed, "--profile", str(REPO / "profiles/naiss"), "-n", "--rerun-triggers", "mtime")
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    # The plan names whose allocation it charges, before anything is submitted.
    assert "Slurm: jobs are charged to account naiss2026-3-205-gpu, partition gpu" in plan.stderr
    run_config = config_from_dict(RUN)
    settings = settings_from_dict({**SETTINGS, **GPU})
    work = estimate_seconds(run_config, settings, SECONDS)
    analyze = math.ceil(2 * work / 60)
    finish = job_minutes(2 * work) - 2 * analyze
    assert job_minutes(2 * work) == 60 * math.ceil((4 * work + 1800) / 3600)
    blocks = re.findall(r"rule (\w+):.*?resources: ([^\n]*)", text, re.S)
    analyze_blocks = [r for rule, r in blocks if rule == "analyze_state"]
    assert len(analyze_blocks) == 6  # 3 states x 2 cases
    for resources in analyze_blocks:
        assert "gpu=1" in resources and "gpu_model=gh200" in resources and f"runtime={analyze}" in resources
        assert "slurm_account=naiss2026-3-205-gpu" in resources and "slurm_partition=gpu" in resources
        assert "cpus_per_task=0" in resources and "cpus_per_gpu=72" in resources and "mem_mb_per_cpu=1527" in resources
    finish_blocks = [r for rule, r in blocks if rule == "finish_state"]
    assert finish_blocks and all(f"runtime={finish}" in r for r in finish_blocks)
    # torch's CPU threads per job (a dry run caps threads at --cores, 1 by default)
    plan = _snakemake(
        indexed, "--profile", str(REPO / "profiles/naiss"), "-n", "--rerun-triggers", "mtime", "--cores", "100"
    )
    assert re.findall(r"rule analyze_state:.*?threads: (\d+)", plan.stdout + plan.stderr, re.S) == ["72"] * 6


def test_gpus_per_job_asks_for_that_many_gh200s_and_scales_the_walltime(indexed):
    """gpus_per_job: 2: every analysis job asks for 2 GPUs (CPUs and memory per GPU follow), its
    walltime is the measured scaling's share of the one-GPU work, and the GPU-hours count both."""
    config = yaml.safe_load((indexed / "config.yaml").read_text())
    config["analyses"]["gpu"]["gpus_per_job"] = 2
    (indexed / "two.yaml").write_text(yaml.safe_dump(config))
    plan = _snakemake(
        indexed,
        "--profile",
        str(REPO / "profiles/naiss"),
        "-n",
        "--rerun-triggers",
        "mtime",
        "--configfile",
        str(indexed / "two.yaml"),
    )
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    work = parallel_seconds(
        estimate_seconds(config_from_dict(RUN), settings_from_dict({**SETTINGS, **GPU}), SECONDS), 2
    )
    analyze = re.findall(r"rule analyze_state:.*?resources: ([^\n]*)", text, re.S)
    assert len(analyze) == 6 and all(
        "gpu=2" in r and "nodes=1" in r and "cpus_per_gpu=72" in r and f"runtime={math.ceil(2 * work / 60)}" in r
        for r in analyze
    )
    hours = 3 * job_minutes(2 * work) / 60 * 2
    assert "split over 2 GPUs" in text and f"× 2 GPUs = {hours:g} GPU-hours requested" in text


def test_uncovered_setup_is_calibrated_first(indexed):
    """No timing entry covers the setup: the calibration job is planned at once (it needs no trained
    run), the analysis jobs' walltimes wait for it, and none is 0; an explicit walltime replaces
    the calibration and is split over the state's group job."""
    config = yaml.safe_load((indexed / "config.yaml").read_text())
    config["analyses"]["gpu"]["settings"]["hvp_batch_size"] = 2  # a setup no timing entry covers
    (indexed / "other.yaml").write_text(yaml.safe_dump(config))
    (indexed / "results/gpu/identity.json").unlink()  # let the changed settings through to planning
    args = [
        "--profile",
        str(REPO / "profiles/naiss"),
        "-n",
        "--rerun-triggers",
        "mtime",
        "--configfile",
        str(indexed / "other.yaml"),
    ]
    plan = _snakemake(indexed, *args)
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    assert re.search(r"^calibrate_timing +1$", text, re.M)
    calibration = re.search(r"rule calibrate_timing:.*?resources: ([^\n]*)", text, re.S).group(1)
    assert "gpu_model=gh200" in calibration and "runtime=60" in calibration
    assert "Slurm walltime: from the calibration job, which runs first" in text
    # The index waits for the calibration; the analysis jobs come after it, with measured walltimes.
    assert re.search(r"^index_states +1$", text, re.M) and not re.search(r"^analyze_state", text, re.M)
    config["cluster"]["walltime_hours"] = 5
    (indexed / "other.yaml").write_text(yaml.safe_dump(config))
    plan = _snakemake(indexed, *args)
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-2000:]
    assert not re.search(r"^calibrate_timing", text, re.M)
    analyze = re.findall(r"rule analyze_state:.*?resources: [^\n]*runtime=(\d+)", text, re.S)
    finish = re.findall(r"rule finish_state:.*?resources: [^\n]*runtime=(\d+)", text, re.S)
    assert set(analyze) == {"149"} and set(finish) == {"2"}  # 2 x 149 + 2 = 300 minutes per state job
    assert "Slurm: ≤ 3 jobs × 5 h (cluster.walltime_hours) = 15 GPU-hours requested" in text


def test_lint_with_the_naiss_profile(indexed):
    lint = _snakemake(indexed, "--profile", str(REPO / "profiles/naiss"), "--lint")
    assert lint.returncode == 0 and "Congratulations" in lint.stdout + lint.stderr, (lint.stdout + lint.stderr)[-3000:]


def test_the_profile_runs_its_own_configuration_beside_a_finished_demo(tmp_path):
    """From a fresh clone with results of a local demo: the naiss profile plans the campaign of
    config/naiss.yaml (the 20M run and its analysis) and neither plans nor rebinds the demo."""
    project_view(tmp_path)  # the project as it stands: its own corpus files resolve
    (tmp_path / "results/demo").mkdir(parents=True)
    (tmp_path / "results/demo/identity.json").write_text(
        json.dumps({"run": "runs/demo", "settings": {"device": "cpu"}, "spectrum": {}, "source": "local"})
    )
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    plan = subprocess.run(
        [
            str(SNAKEMAKE),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--profile",
            str(REPO / "profiles/naiss"),
            "-n",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    assert "Config file config/config.yaml is replaced" in text
    naiss = yaml.safe_load((PROJECT / "config/naiss.yaml").read_text()) or {}
    if "20m" not in (naiss.get("train_runs") or {}) or "20m-gh200" not in (naiss.get("analyses") or {}):
        pytest.skip("config/naiss.yaml no longer holds the 20m run and its analysis (edited by its user); it plans")
    assert re.search(r"^train_run +1$", text, re.M) and "runs/20m/trained.json" in text
    assert "analysis 20m-gh200: ≤ 11 states (interval checkpoints: initialisation + 10 epochs) × 2 cases" in text
    assert "demo" not in text.replace("cache_source: demo", "")


def test_seed_experiments_run_through_the_naiss_profile(tmp_path):
    """A seed experiment under the profile (walltimes not estimated): its runs are trained and its
    checkpoints measured by GPU jobs (72 threads, the experiment's walltime); reference and
    comparison stay local."""
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(RUN))
    experiment = {
        "config": str(tmp_path / "run.yaml"),
        "shard_tokens": 64,
        "seeds": [1, 2],
        "controls": [],
        "walltime_minutes": 45,
    }
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"train_runs": {}, "analyses": {}, "seed_experiments": {"pair": experiment}})
    )
    plan = _snakemake(
        tmp_path,
        "--profile",
        str(REPO / "profiles/naiss"),
        "-n",
        "--cores",
        "100",
        "--config",
        "cluster={'walltime': 'none'}",
    )
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    jobs = {name: block for name, block in re.findall(r"\n(?:rule|checkpoint) (\w+):\n((?:    .*\n)+)", text)}
    measure = jobs["measure_geometry"]
    assert "threads: 72" in measure and "gpu_model=gh200" in measure and "runtime=45" in measure
    assert re.search(r"measure_geometry\s+6\b", text)  # 2 runs x 3 checkpoints (epoch-000 to epoch-002)
    assert "gpu=1" not in jobs["compare_seeds"] and "gpu=1" not in jobs["geometry_reference"]  # no GPU asked for
    calibrate = _snakemake(tmp_path, "--profile", str(REPO / "profiles/naiss"), "-n", "calibrate")
    assert "calibrate_geometry" in calibrate.stdout + calibrate.stderr  # `calibrate` covers experiments too


def test_a_critical_batch_experiment_runs_through_the_naiss_profile(tmp_path):
    """Its base run and branches are GPU training jobs (a branch after its base run), each
    checkpoint's held-out losses a GPU job of 72 threads, the table local; the price is printed."""
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(RUN))
    experiment = {"config": str(tmp_path / "run.yaml"), "shard_tokens": 64, "checkpoints": [1]}
    experiment |= {"batch_sizes": [2, 4], "data_seeds": [1, 2], "token_budget": 256, "eval_sequences": 4}
    experiment |= {"set": {"training.tokens": 1024}}  # room for each seed's own 16 sequences
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"train_runs": {}, "analyses": {}, "cbs_experiments": {"cbs": experiment}})
    )
    plan = _snakemake(tmp_path, "--profile", str(REPO / "profiles/naiss"), "-n", "--cores", "100")
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    jobs = {name: block for name, block in re.findall(r"\n(?:rule|checkpoint) (\w+):\n((?:    .*\n)+)", text)}
    assert "threads: 72" in jobs["evaluate_branches"] and "gpu=1" in jobs["evaluate_branches"]
    assert re.search(r"train_run\s+1\b", text) and re.search(r"train_branch\s+4\b", text)  # 2 sizes x 2 seeds
    assert "runtime=1440" in jobs["train_run"] and "gpu=1" in jobs["train_branch"]
    # 256 of the base run's 1,024 tokens: 1440 min / 4 + 30 min, rounded up to 7 h
    assert "runtime=420" in jobs["train_branch"] and "threads: 72" in jobs["train_branch"]
    assert "gpu=1" not in jobs["critical_batch"]
    assert "cbs experiment cbs: 1 checkpoint × 2 batch sizes" in text
    assert "training 1 run(s) × 24 h + 4 branch run(s), 28 h (scaled by their tokens)" in text


def test_seed_experiment_walltime_from_a_timing_entry(tmp_path):
    """Under walltime: estimate a timing entry of the measurement setup prices each checkpoint's job
    (2 x work + 30 min, rounded up to the hour); without one, walltime_minutes applies."""
    from tiny_llm.campaign.timing import timing_key
    from tiny_llm.geometry.settings import GeometrySettings, as_analysis_settings, measurement_seconds

    (tmp_path / "run.yaml").write_text(yaml.safe_dump(RUN))
    settings = GeometrySettings(device="cuda", dtype="float32", reference_rows=64, lanczos_steps=200)
    run_config = config_from_dict({**RUN, "training": {**RUN["training"], "seed": 1}})
    key = timing_key(run_config, as_analysis_settings(settings), "cuda:NVIDIA GH200 480GB")
    (tmp_path / "timing.json").write_text(json.dumps({"entries": [{"key": key, "seconds": SECONDS}]}))
    experiment = {
        "config": str(tmp_path / "run.yaml"),
        "shard_tokens": 64,
        "seeds": [1, 2],
        "controls": [],
        "walltime_minutes": 45,
        "settings": {"reference_rows": 64, "lanczos_steps": 200},
    }
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "train_runs": {},
                "analyses": {},
                "seed_experiments": {"pair": experiment},
                "cluster": {
                    "walltime": "estimate",
                    "gpu_kind": "GH200",
                    "timing_profiles": [str(tmp_path / "timing.json")],
                },
            }
        )
    )
    plan = _snakemake(tmp_path, "--profile", str(REPO / "profiles/naiss"), "-n", "--cores", "100")
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    expected = job_minutes(measurement_seconds(run_config, settings, SECONDS))
    assert expected > 60  # the estimate, not the explicit 45 minutes
    runtimes = set(re.findall(r"rule measure_geometry:\n(?:    .*\n)*?    resources: .*runtime=(\d+)", text))
    assert runtimes == {str(expected)}


@pytest.mark.slow  # about 2 minutes: make test-slow (calibration itself: tests/unit/campaign/test_calibration.py)
def test_a_campaign_without_timings_calibrates_then_runs_with_measured_walltimes(tmp_path):
    """Locally (no Slurm), with walltimes estimated and no timing entry, an analysis and a seed
    experiment: the dry run plans the calibrations first; the analysis's index waits for its
    calibration; the experiment's calibration runs before its
    reference set; every analysis and measurement job gets the walltime its measured timings give,
    and both complete."""
    from tiny_llm.geometry.settings import geometry_settings_from_dict, measurement_seconds

    (tmp_path / "run.yaml").write_text(yaml.safe_dump(RUN))
    geometry = {
        "reference_rows": 4,
        "cov_num_batches": 2,
        "cov_batch_size": 2,
        "top_k": 1,
        "hutchinson_samples": 2,
        "lanczos_steps": 4,
        "hvp_batch_size": 4,
    }
    experiment = {
        "config": str(tmp_path / "run.yaml"),
        "shard_tokens": 64,
        "seeds": [1, 2],
        "controls": [],
        "settings": geometry,
    }
    config = {
        "train_runs": {"tiny": {"config": str(tmp_path / "run.yaml"), "shard_tokens": 64}},
        "analyses": {"cpu": {"run": "runs/tiny", "settings": {**SETTINGS, "device": "cpu", "dtype": "float64"}}},
        "seed_experiments": {"pair": experiment},
        "cluster": {"walltime": "estimate", "timing_profiles": ["results/timing"]},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    plan = _snakemake(tmp_path, "-n", "-c2")
    assert re.search(r"^calibrate_geometry +1$", plan.stdout, re.M) and "measure_geometry" not in plan.stdout
    assert re.search(r"^calibrate_timing +1$", plan.stdout, re.M)
    run = _snakemake(tmp_path, "-c2", "--printshellcmds")
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-3000:]
    entry = json.loads((tmp_path / "results/timing/cpu.json").read_text())["entries"][0]
    work = estimate_seconds(
        config_from_dict(RUN), settings_from_dict(config["analyses"]["cpu"]["settings"]), entry["seconds"]
    )
    runtimes = re.findall(r"rule analyze_state:.*?resources: [^\n]*runtime=(\d+)", text, re.S)
    assert len(runtimes) == 6 and set(runtimes) == {str(math.ceil(2 * work / 60))}
    order = [m.group(1) for m in re.finditer(r"^(?:local)?(?:rule|checkpoint) (\w+):", text, re.M)]
    assert order.index("calibrate_timing") < order.index("index_states") < order.index("analyze_state")
    assert (tmp_path / "results/cpu/summary.csv").exists()
    entry = json.loads((tmp_path / "results/timing/pair.json").read_text())["entries"][0]
    run_config = config_from_dict({**RUN, "training": {**RUN["training"], "seed": 1}})
    expected = job_minutes(measurement_seconds(run_config, geometry_settings_from_dict(geometry), entry["seconds"]))
    runtimes = re.findall(r"rule measure_geometry:\n(?:    .*\n)*?    resources: [^\n]*runtime=(\d+)", text)
    assert len(runtimes) == 6 and set(runtimes) == {str(expected)}
    assert order.index("calibrate_geometry") < order.index("geometry_reference") < order.index("measure_geometry")
    assert (tmp_path / "results/pair/comparison.csv").exists()


def test_short_states_are_packed_several_to_a_cluster_job(indexed):
    """Under the walltime estimate, states whose work is a minute or two share a cluster job (one
    after another, its walltime the sum of theirs, each state's margin shared): the cost line says
    how many jobs (the dry run's listing keeps one group per state; packed through a real Slurm in
    tests/slurm)."""
    fast = {"startup": 5.0, "gradient_microbatch": 0.01, "hvp_microbatch_pass": 0.5}
    entries = json.loads((indexed / "timing.json").read_text())["entries"]
    (indexed / "fast.json").write_text(json.dumps({"entries": [{**entries[0], "seconds": fast}]}))
    config = yaml.safe_load((indexed / "config.yaml").read_text())
    config["cluster"]["timing_profiles"] = [str(indexed / "fast.json")]
    (indexed / "fast.yaml").write_text(yaml.safe_dump(config))
    args = ["--profile", str(REPO / "profiles/naiss"), "-n", "--rerun-triggers", "mtime"]
    plan = _snakemake(indexed, *args, "--configfile", str(indexed / "fast.yaml"))
    text = plan.stdout + plan.stderr
    assert plan.returncode == 0, text[-3000:]
    work = estimate_seconds(config_from_dict(RUN), settings_from_dict({**SETTINGS, **GPU}), fast)
    per_job = states_per_job(2, work)
    assert per_job >= 3 and text.count("Group job analysis-gpu") == 3  # a dry run lists one per state
    finish = re.findall(r"rule finish_state:.*?resources: [^\n]*runtime=(\d+)", text, re.S)
    assert finish == [str(finish_minutes(2, work, per_job))] * 3
    hours = group_minutes(3, 2, work) / 60
    assert f"Slurm: ≤ 1 jobs of ≤ 3 states × {hours:.3g} h walltime" in text
