"""The cost line before a run: its counts equal what a measurement actually does, its states what
training writes, and its time the timing estimate."""

import json

import pytest
from builders import make_oracle_run

from tiny_llm.campaign.plan import (
    ClusterSettings,
    Jobs,
    case_work,
    cost_line,
    estimate_seconds,
    expected_states,
    format_seconds,
    group_minutes,
    job_minutes,
    measurement_plan,
    states_per_job,
)
from tiny_llm.training.loop import train
from tiny_llm.workers.index import index_states
from tiny_llm.workers.settings import AnalysisSettings
from tiny_llm.workers.state import analyze_state


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan")
    config = make_oracle_run(path, epochs=3, tokens=3 * 6 * 3 * 3)
    return config, path


@pytest.mark.parametrize(
    "samples, K, hvp, blocks, step, audit",
    [
        (2, 4, None, False, False, True),
        (None, 3, 2, False, False, False),
        (99, 16, 1, False, True, False),
        (2, 4, None, True, True, True),
    ],
)
def test_counts_equal_those_of_a_measurement(run, samples, K, hvp, blocks, step, audit):
    """The price's counts are the job's: with a successor (``step``), the step Δ (per block too) and
    the loss at θ + Δ are priced as the job runs them, and the forms in the optimizer's geometry; the
    plan the job records is the plan the price reads, audit included (a sharded job's: in
    tests/unit/curvature/test_sharded_noise.py)."""
    config, path = run
    if not (path / "run" / "final.pt").exists():
        train(config, path / "run")
    settings = AnalysisSettings(
        noise_samples=samples,
        random_samples=5,
        directions_per_pass=K,
        hvp_batch_size=hvp,
        device="cpu",
        dtype="float64",
        block_curvature=blocks,
        trajectory=step,
        audit=audit,
    )
    successor = {"key": "next", "file": "epoch-002.safetensors", "step": 2 * config.steps_per_epoch} if step else None
    out = path / f"r-{samples}-{K}-{hvp}-{blocks}-{step}-{audit}.json"
    result = analyze_state(path / "run", ["epoch-001.safetensors"], "seen", settings, out, successor=successor)
    work, counts = case_work(config, settings), result["counts"]
    plan = measurement_plan(config, settings)
    assert result["measurement_plan"] == plan.record(K) and plan.passes(K) == work.passes == counts["hvp_passes"]
    if audit:  # the audit's directions in both geometries, and its micro-batches and float64 gradients
        assert len(result["audit"]["directions"]) == plan.audit_directions == 2 * (2 + 4 + 1)
        assert len(result["audit"]["micro_batches"]) == plan.audit_micro_batches == work.audit_microbatches
        assert work.audit_gradient_microbatches == plan.audit_gradient_batches * 2 == (3 + 2) * 2  # B 3, micro 2
    assert (result["trajectory"] is not None) == step
    assert work.noise_samples == counts["noise_samples"]
    per_block = len(result["blocks"]) if blocks else 0
    geometries = 2 if result["preconditioned"] is not None else 1  # the run kept its Adam moments: 2
    assert geometries == 2
    noise_and_gradient = (counts["noise_samples"] + 1) * (1 + per_block) + counts["random_samples"]
    assert work.directions == noise_and_gradient * geometries + step * (1 + per_block)
    micro = -(-config.training.batch_size // config.training.micro_batch_size)
    assert work.forward_microbatches == (counts["epoch_batches"] * micro if step else 0)
    assert work.hvp_microbatches == counts["hvp_batches"]
    assert work.passes == counts["hvp_passes"]  # no zero directions here: every direction takes its pass
    micro = -(-config.training.batch_size // config.training.micro_batch_size)
    assert work.gradient_microbatches == (counts["epoch_batches"] + counts["noise_samples"]) * micro


def test_expected_states_before_and_after_training(run, tmp_path):
    config, path = run
    assert expected_states(config, tmp_path / "not-yet", "all") == (
        4,
        "interval checkpoints: initialisation + 3 epochs",
    )
    final_only = config.__class__(
        **{
            **config.__dict__,
            "training": config.training.__class__(**{**config.training.__dict__, "checkpoint_policy": "final"}),
        }
    )
    assert expected_states(final_only, tmp_path / "not-yet", "all")[0] == 1
    assert expected_states(config, tmp_path, ["epoch-001.safetensors", "final.pt"]) == (2, "listed checkpoints")
    if not (path / "run" / "final.pt").exists():
        train(config, path / "run")
    indexed = index_states(path / "run", "all", consensus=False)
    assert expected_states(None, path / "run", "all") == (len(indexed["states"]), "checkpoints in the run")
    (tmp_path / "states.json").write_text(json.dumps({"states": indexed["states"][:2]}))
    assert expected_states(config, path / "run", "all", analysis_dir=tmp_path) == (2, "indexed")


def test_cost_line_says_jobs_work_and_time(run):
    config, _ = run
    settings = AnalysisSettings(noise_samples=2, random_samples=5, directions_per_pass=4, device="cpu", dtype="float64")
    work = case_work(config, settings)
    seconds = {"process": 3.0, "startup": 1.0, "gradient_microbatch": 0.5, "hvp_microbatch_pass": 2.0}
    each = estimate_seconds(config, settings, seconds)
    assert (
        each
        == work.seconds(seconds)
        == (
            3.0
            + 1.0
            + (work.gradient_microbatches + work.forward_microbatches) * 0.5
            + work.passes * work.hvp_microbatches * 2
        )
    )
    line = cost_line(
        "a",
        Jobs(
            4,
            "interval",
            ("seen", "unseen"),
        ),
        work,
        "cpu",
        {"key": {"device_kind": "cpu"}, "seconds": seconds, "measured": {"host": "h", "at": "2026-01-02T03:04:05"}},
    )
    assert line.startswith("analysis a: ≤ 4 states (interval) × 2 cases = 8 (state, case) jobs; each: ")
    assert f"{work.directions} quadratic forms in {work.passes} passes × {work.hvp_microbatches} curvature" in line
    assert (
        f"about {each:.0f} s per job, {8 * each / 60:.0f} min in all on cpu (timings measured on cpu, 2026-01-02)"
        in line
    )
    assert " h," not in line  # no host names
    assert "no timing entry for this setup on cpu (`snakemake calibrate`" in cost_line(
        "a", Jobs(4, "x", ("seen",)), work, "cpu", None
    )
    entry = {"seconds": seconds, "measured": {}}
    slurm = cost_line(
        "a",
        Jobs(4, "x", ("seen", "unseen")),
        work,
        "cuda",
        entry,
        ClusterSettings(walltime="estimate"),
    )
    per_job = min(4, states_per_job(2, each))
    jobs, hours = -(-4 // per_job), group_minutes(per_job, 2, each) / 60
    packed = f" of ≤ {per_job} states" if per_job > 1 else ""
    assert slurm.endswith(
        f"; Slurm: ≤ {jobs} jobs{packed} × {hours:.3g} h walltime (2 × work + 30 min) = "
        f"{jobs * hours:.4g} GPU-hours requested"
    )
    one = cost_line(
        "a",
        Jobs(4, "x", ("seen", "unseen")),
        work,
        "cuda",
        entry,
        ClusterSettings("estimate", states_per_job=1),
    )
    hours = job_minutes(2 * each) / 60
    assert one.endswith(
        f"; Slurm: ≤ 4 jobs × {hours:.3g} h walltime (2 × work + 30 min) = {4 * hours:.4g} GPU-hours requested"
    )
    assert cost_line("a", Jobs(3, "x", ("seen",)), work, "cuda", None, ClusterSettings(walltime_hours=5)).endswith(
        "; Slurm: ≤ 3 jobs × 5 h (cluster.walltime_hours) = 15 GPU-hours requested"
    )
    packed = ClusterSettings(walltime_hours=5, states_per_job=2)  # priced as packed: 2 jobs of 2 states × 5 h
    assert cost_line("a", Jobs(3, "x", ("seen",)), work, "cuda", None, packed).endswith(
        "; Slurm: ≤ 2 jobs of ≤ 2 states × 5 h (cluster.walltime_hours) = 15 GPU-hours requested"
    )
    for cluster, entry_given in (
        (ClusterSettings(walltime_hours=30, states_per_job=3), None),  # 90 h in one job
        (ClusterSettings("estimate", states_per_job=32), {"seconds": {k: 600 * v for k, v in seconds.items()}}),
    ):
        with pytest.raises(
            ValueError,
            match=r"cluster.states_per_job: \d+ states of analysis a in one job ask for .* "
            r"beyond the partition's 72 h; set it to \d+ or less",
        ):
            cost_line(
                "a",
                Jobs(
                    64,
                    "x",
                    ("seen", "unseen"),
                ),
                work,
                "cuda",
                entry_given,
                cluster,
            )
    assert "Slurm walltime: from the calibration job, which runs first on the target node (results/timing/a.json" in (
        cost_line("a", Jobs(3, "x", ("seen",)), work, "cuda", None, ClusterSettings(walltime="estimate"))
    )


def test_durations_read_as_seconds_minutes_or_hours():
    assert [format_seconds(s) for s in (5, 119, 120, 7199, 7200, 36_000)] == [
        "5 s",
        "119 s",
        "2 min",
        "120 min",
        "2.0 h",
        "10.0 h",
    ]


def test_a_training_order_window_is_priced_as_its_own_epoch(run):
    """A case whose batches are a window of a published order (4 noise batches of 2 sequences here),
    not the run's epoch: the price counts the window's batches, as the job does."""
    config, _ = run
    settings = AnalysisSettings(noise_samples=32, random_samples=2, directions_per_pass=2, device="cpu")
    plan = measurement_plan(config, settings, epoch=(4, 2))
    assert (plan.n_batches, plan.noise_samples) == (4, 4)
    assert plan.hvp_batches == -(-4 * 2 // config.training.micro_batch_size)
    micro = -(-2 // config.training.micro_batch_size)
    assert case_work(config, settings, epoch=(4, 2)).gradient_microbatches == (4 + 4) * micro
    assert measurement_plan(config, settings).n_batches == config.steps_per_epoch  # by default the run's epoch
