"""preconditioned: true checked at start-up against every selected state: what has no optimizer
preconditioner is named with its reason before any job (the measurement's own check:
tests/unit/workers/test_preconditioning.py)."""

import pytest
from workflow_plans import SETTINGS, plan_config

from tiny_llm.campaign.preconditioned import Selected, check_preconditioned, imported_states, trained_states
from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.config import config_from_dict

RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/tiny", "seq_len": 16, "shuffle_group_blocks": 4},
    "training": {"batch_size": 4, "micro_batch_size": 2, "tokens": 512, "epochs": 2, "checkpoint_policy": "interval"},
}


def _config(**training):
    return config_from_dict({**RUN, "training": {**RUN["training"], **training}})


def test_a_run_trained_here_has_a_preconditioner_from_its_first_step_on(tmp_path):
    config = _config()
    states = trained_states(config, "all")
    assert [(s.label, s.step) for s in states] == [("epoch-000.safetensors", 0), ("epoch-001.safetensors", 4),
                                                   ("epoch-002.safetensors", 8)]  # fmt: skip
    refusal = (
        r"^k: true, but 1 of the 3 selected states have no optimizer preconditioner "
        r"\(epoch-000.safetensors: at step 0 Adam has no second moment yet\); set preconditioned: auto"
    )
    with pytest.raises(ValueError, match=refusal):
        check_preconditioned("k", config, tmp_path, states)
    check_preconditioned("k", config, tmp_path, trained_states(config, ["epoch-001.safetensors", "final.pt"]))
    check_preconditioned("k", _config(optimizer="sgd", momentum=0.9), tmp_path, states)  # P = I from step 0
    later = trained_states(config, ["epoch-001.safetensors", "epoch-002.safetensors"])
    with pytest.raises(ValueError, match=r"2 of the 2 .* trained without training.keep_moments"):
        check_preconditioned("k", _config(keep_moments=False), tmp_path, later)


def test_an_imported_suite_needs_each_selected_checkpoints_optimizer_state(tmp_path):
    for name in ("step0", "step4", "step8"):
        (tmp_path / name).mkdir()
    (tmp_path / "step8" / "optimizer.pt").write_bytes(b"")
    checkpoints = [{"path": str(tmp_path / n), "revision": n} for n in ("step0", "step4", "step8")]
    states = imported_states(checkpoints, [0, 4, 8], "all")
    with pytest.raises(ValueError, match=r"2 of the 3 selected states .* \(step0, step4: at step 0 Adam has no "
                       r"second moment yet; no optimizer.pt \(weights only\)\)"):  # fmt: skip
        check_preconditioned("k", _config(), tmp_path, states)
    assert imported_states(checkpoints, [0, 4, 8], ["epoch-002.safetensors"]) == [
        Selected("step8", 8, tmp_path / "step8")
    ]
    check_preconditioned("k", _config(), tmp_path, imported_states(checkpoints, [0, 4, 8], ["epoch-002.safetensors"]))
    adapter = imported_states(checkpoints, [0, 4, 8], ["epoch-002.safetensors"], adapter=True)
    with pytest.raises(ValueError, match=r"\(step8: an adapter's import keeps no optimizer state\)"):
        check_preconditioned("k", _config(), tmp_path, adapter)


def test_the_workflow_refuses_it_at_start_up_by_key(workflow_project):
    settings = {**SETTINGS, "device": "cuda", "dtype": "float32", "preconditioned": True}
    with pytest.raises(ValueError, match=r"^analyses.gpu.settings.preconditioned: true, but 1 of the 3 selected "
                       r"states .*\(epoch-000.safetensors: at step 0"):  # fmt: skip
        WorkflowPlan(plan_config(settings=settings))
    WorkflowPlan(plan_config(settings={**settings, "preconditioned": "auto"}))  # the advice: accepted
    WorkflowPlan(plan_config(settings=settings, checkpoints=["epoch-001.safetensors", "epoch-002.safetensors"]))
