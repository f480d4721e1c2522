"""What a campaign will cost, said before it runs: the campaign line, each analysis's and seed
experiment's cost line, and the memory of each job."""

from pathlib import Path

import pytest
from workflow_plans import SETTINGS, plan_config

from tiny_llm.campaign.plan import job_minutes
from tiny_llm.campaign.workflow import WorkflowPlan


def test_the_campaign_line_counts_training_calibration_and_analyses(workflow_project):
    """Under a cluster walltime rule the dry run totals every GPU-hour asked for: the training job's
    walltime, the calibration jobs' and the analyses' state jobs; a local run prints no total."""
    plan = WorkflowPlan(plan_config({"walltime": "estimate", "gpu_kind": "GH200"}))
    hours = 3 * job_minutes(2 * plan.walltimes.case_work_seconds("gpu")) / 60  # 3 states (initialisation + 2 epochs)
    assert plan.costs.cost_lines(1440, 60)[-1] == (
        f"campaign on Slurm: training 1 run(s) × 24 h + analyses {hours:g} "
        f"GPU-hours = at most {24 + hours:g} GPU-hours requested"
    )
    pending = WorkflowPlan(plan_config({"walltime": "estimate", "gpu_kind": "A100"}))  # calibrates first
    assert pending.costs.campaign_line(1440, 60) == (
        "campaign on Slurm: training 1 run(s) × 24 h + calibration 1 job(s) "
        "× 1 h = at most 25 GPU-hours requested (+ gpu: priced by its "
        "calibration)"
    )
    assert WorkflowPlan(plan_config()).costs.campaign_line(1440, 60) is None
    Path("runs/tiny").mkdir(parents=True)
    Path("runs/tiny/trained.json").write_text("{}")  # trained already: not asked for again
    assert plan.costs.campaign_line(1440, 60).startswith(f"campaign on Slurm: analyses {hours:g} GPU-hours")


def test_a_seed_experiment_prints_its_cost(workflow_project):
    config = {
        "seed_experiments": {"exp": {"config": "run.yaml", "seeds": [1, 2], "settings": {"device": "cpu"}}},
        "cluster": {"timing_profiles": ["timing.json"]},
    }
    line = WorkflowPlan(config).costs.cost_lines()[0]
    # 2 seeds and the 2 controls, each with the initialisation and 2 epochs measured.
    assert line.startswith(
        "seed experiment exp: 4 runs (seeds and controls) trained, 12 checkpoint measurements; each: "
    ) and line.endswith("time: no timing entry for this setup on cpu")


def test_the_plan_states_the_memory_of_each_job_and_refuses_one_that_cannot_fit(workflow_project):
    """The cost line names the predicted peak and the grouping under the budget; a budget below
    one sequence is refused while planning, naming the analysis and the setting."""
    budgeted = plan_config(settings={**SETTINGS, "device": "cuda", "dtype": "float32", "memory_budget_gb": 0.01})
    line = WorkflowPlan(budgeted).costs.cost_line("gpu")
    assert "memory: predicted peak ~" in line and "budget 10.2 MiB" in line and "forms " in line
    default = WorkflowPlan(plan_config()).costs.cost_line("gpu")
    assert "budget: the GPU's free memory at run time, cut to fit" in default
    tiny = plan_config(settings={**SETTINGS, "device": "cuda", "dtype": "float32", "memory_budget_gb": 1e-5})
    with pytest.raises(
        ValueError,
        match=r"analyses.gpu.settings: gradient: one sequence of 16 tokens needs ~.* "
        r"more than memory_budget_gb = 10.5 KiB; lower data.seq_len",
    ):
        WorkflowPlan(tiny)
