"""The walltime of every cluster job, from a timing entry or the cluster's rule, and the calibration
it waits for."""

import math

import pytest
from workflow_plans import RUN, SECONDS, SETTINGS, plan_config

from tiny_llm.campaign.plan import estimate_seconds, job_minutes
from tiny_llm.campaign.targets import all_targets
from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.config import config_from_dict
from tiny_llm.workers.settings import settings_from_dict


def test_walltimes_from_the_timing_entry_complete_the_group_to_the_hour(workflow_project):
    plan = WorkflowPlan(plan_config({"walltime": "estimate", "gpu_kind": "GH200"}))
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


def test_an_uncovered_setup_calibrates_first(workflow_project):
    plan = WorkflowPlan(plan_config({"walltime": "estimate", "gpu_kind": "A100"}))  # no A100 entry
    assert plan.walltimes.calibration_pending("gpu") and plan.walltimes.calibration("gpu") == [
        "results/timing/gpu.json"
    ]
    assert "results/timing/gpu.json" in all_targets(plan.campaign, plan.walltimes)
    with pytest.raises(ValueError, match="no timing profile covers analysis gpu"):
        plan.walltimes.case_work_seconds("gpu")
    assert "from the calibration job, which runs first" in plan.costs.cost_line("gpu")


def test_explicit_walltime_is_split_over_the_state_job(workflow_project):
    plan = WorkflowPlan(plan_config({"walltime_hours": 2}))
    assert (plan.walltimes.analyze_runtime("gpu"), plan.walltimes.finish_runtime("gpu")) == (59, 2)  # 2 × 59 + 2 = 120
    assert plan.walltimes.rule() == "cluster.walltime_hours: 2 per state job"
    one_case = WorkflowPlan(plan_config({"walltime_hours": 1}, cases=["seen"]))
    assert (one_case.walltimes.analyze_runtime("gpu"), one_case.walltimes.finish_runtime("gpu")) == (59, 1)
    local = WorkflowPlan(plan_config())
    assert (local.walltimes.analyze_runtime("gpu"), local.walltimes.finish_runtime("gpu")) == (60, 5)
