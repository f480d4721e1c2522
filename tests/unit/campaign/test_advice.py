"""Each start-up refusal's advice, followed once: the configuration changed as the refusal says is
planned (a refusal whose advice the workflow then refuses too would send a user in a circle)."""

import json
import re
from pathlib import Path

import pytest
from workflow_plans import SETTINGS, plan_config

from tiny_llm.campaign.workflow import WorkflowPlan

CPU = {**SETTINGS, "device": "cpu"}


def _analysis(**changes):
    config = plan_config(settings=CPU)
    config["analyses"]["gpu"] |= changes
    return config


def _run(**training):
    config = plan_config(settings=CPU)
    config["train_runs"]["tiny"]["set"] = {f"training.{k}": v for k, v in training.items()}
    return config


def _seeds(**entry):
    experiment = {"config": "run.yaml", "seeds": [1, 2], "controls": [], **entry}
    return {"train_runs": {}, "analyses": {}, "seed_experiments": {"exp": experiment}}


ADVICE = {
    "preconditioned true at step 0 -> auto": (
        _analysis(settings={**CPU, "preconditioned": True}),
        r"analyses.gpu.settings.preconditioned: true, but .*; set preconditioned: auto",
        _analysis(settings={**CPU, "preconditioned": "auto"}),
    ),
    "preconditioned true at step 0 -> select states that have one": (
        _analysis(settings={**CPU, "preconditioned": True}),
        r"or select only states that have one \(checkpoints\)",
        _analysis(settings={**CPU, "preconditioned": True}, checkpoints=["epoch-001.safetensors"]),
    ),
    "sharded on one rank -> gpus_per_job": (
        _analysis(settings={**CPU, "sharded": True}),
        r"analyses.gpu.settings.sharded: .* set gpus_per_job to the GPUs to shard over, or sharded: false",
        _analysis(settings={**CPU, "sharded": True}, gpus_per_job=2),
    ),
    "keep_states past the epochs -> within them": (
        _run(keep_states=[5]),
        r"training.keep_states",
        _run(keep_states=[2]),
    ),
    "a seed experiment's cache outside cache/ -> one in it": (
        _seeds(set={"data.cache": "/data/elsewhere"}),
        r"seed_experiments.exp.config: data.cache must be cache/<name> .* set data.cache in set",
        _seeds(set={"data.cache": "cache/elsewhere"}),
    ),
}


@pytest.mark.parametrize("case", ADVICE)
def test_a_refusals_advice_is_accepted(workflow_project, case):
    bad, refusal, advised = ADVICE[case]
    with pytest.raises(ValueError, match=refusal):
        WorkflowPlan(bad)
    WorkflowPlan(advised)


def test_a_cache_prepared_otherwise_is_refused_and_another_name_accepted(workflow_project):
    plan = WorkflowPlan(plan_config(settings=CPU))
    Path("cache").mkdir()
    spec = {**plan.runs.cache_spec("tiny"), "shard_tokens": 1}
    Path("cache/tiny.prepared.json").write_text(json.dumps({"cache": "cache/tiny", "spec": spec}))
    with pytest.raises(ValueError, match=re.escape("name another cache/<name> in its data.cache")):
        WorkflowPlan(plan_config(settings=CPU))
    advised = plan_config(settings=CPU)
    advised["train_runs"]["tiny"]["set"] = {"data.cache": "cache/another"}
    WorkflowPlan(advised)
