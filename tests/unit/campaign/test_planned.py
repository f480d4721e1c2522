"""The campaign as planned: each analysis typed and frozen from its configuration entry."""

import dataclasses

import pytest
from workflow_plans import SETTINGS, plan_config

from tiny_llm.campaign.planned import AnalysisPlan, Campaign
from tiny_llm.campaign.workflow import WorkflowPlan


def test_an_analysis_is_planned_typed_and_frozen(workflow_project):
    campaign = WorkflowPlan(plan_config(cases=["seen"])).campaign
    assert isinstance(campaign, Campaign) and campaign.trained_runs == ("tiny",)
    gpu = campaign.analyses["gpu"]
    assert isinstance(gpu, AnalysisPlan)
    assert gpu.run_dir == "runs/tiny" and gpu.cases == ("seen",) and gpu.ranks == 1 and not gpu.spectrum
    assert gpu.settings.directions_per_pass == SETTINGS["directions_per_pass"] and gpu.settings.device == "cuda"
    assert gpu.run is not None and gpu.run.model.d_model == 8  # the run's configuration, read once
    assert gpu.memory is not None and gpu.memory.passes  # its jobs' memory plan, known before they run
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.cases = ("unseen",)
