"""The workflow's imports of suites trained elsewhere, as downloaded: an analysis's hf_checkpoints
given as a repository and a selection of its revisions in the local Hugging Face cache plan with
each revision's folder, its step from its name and tokens from tokens_per_step; what is not in the
cache is refused at start-up, naming the key and the command that fetches it."""

import sys
from pathlib import Path

import huggingface_hub
import pytest

from tiny_llm.campaign.workflow import WorkflowPlan

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hf_hub import RUN_YAML, cache_revision, neox_suite


@pytest.fixture
def project(tmp_path, monkeypatch):
    folders = neox_suite(tmp_path / "saved", (0, 1, 2, 4))
    for step, folder in folders.items():
        cache_revision(tmp_path / "hf", "org/p", f"step{step}", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(RUN_YAML)
    (tmp_path / "a.txt").write_text("the suite's reference text " * 500)
    return tmp_path


def _analysis(checkpoints):
    entry = {"config": "run.yaml", "hf_checkpoints": checkpoints, "tokens_per_step": 16, "cache_inputs": ["a.txt"]}
    return {"analyses": {"p": {**entry, "cases": ["offset"]}}}


def test_a_suite_of_cached_revisions_plans_with_their_steps(project):
    plan = WorkflowPlan(_analysis({"repo": "org/p", "revisions": {"min_step": 1}}))
    positions = plan.runs.positions["p"]
    assert [(p.step, p.step_source, p.tokens) for p in positions] == [
        (1, "revision name step1", 16),
        (2, "revision name step2", 32),
        (4, "revision name step4", 64),
    ]
    spec = plan.runs.import_spec("p")
    assert spec["hub"] == [["org/p", "step1"], ["org/p", "step2"], ["org/p", "step4"]]
    assert all("/snapshots/" in d for d in spec["directories"])
    listed = WorkflowPlan(_analysis([{"repo": "org/p", "revision": "step4"}]))
    assert [p.step for p in listed.runs.positions["p"]] == [4]


def test_a_revision_not_in_the_cache_is_refused_at_start_up(project):
    with pytest.raises(ValueError, match=r"analyses.p.hf_checkpoints: step3 not in the local cache .* hf download"):
        WorkflowPlan(_analysis({"repo": "org/p", "revisions": ["step1", "step3"]}))
    with pytest.raises(ValueError, match=r"analyses.p.hf_checkpoints: org/q has no named revision in the local"):
        WorkflowPlan(_analysis({"repo": "org/q"}))


def test_a_suite_with_its_training_order_plans_windowed_cases(project):
    """seen, unseen and recent of an imported suite with its published order: each job's window
    at its checkpoint's step, the order bound to the output directory; refusals at start-up."""
    import numpy as np

    from tiny_llm.data.training_order import write_megatron

    write_megatron(project / "document", np.zeros((20, 9), dtype=np.uint16))
    order = {"path": str(project / "document"), "sequences_per_step": 2}
    config = _analysis({"repo": "org/p", "revisions": {"min_step": 2}})
    entry = config["analyses"]["p"]
    entry.update(training_order=order, case_steps=2, cases=["seen", "unseen", "recent"])
    plan = WorkflowPlan(config)
    assert plan.case_order("p", "seen", 4).case["window"] == [1, 2]  # up to the earliest analysed (step 2)
    assert plan.case_order("p", "unseen", 2).case["window"] == [5, 6]  # right after the latest (step 4)
    assert plan.case_order("p", "recent", 4).case["window"] == [3, 4]
    assert plan.case_order("p", "offset", 4).case is None
    assert plan.binding("p")["training_order"]["case_steps"] == 2
    for change, message in (
        ({"case_steps": 3}, r"analyses.p.cases: case seen: the earliest analysed checkpoint \(step 2\) has trained 2"),
        ({"case_steps": 7, "cases": ["unseen"]}, r"case unseen reads steps 5..11, but the training order holds 10"),
        ({"training_order": {**order, "path": "nowhere"}}, r"analyses.p.training_order: .*nowhere.idx does not exist"),
        ({"batch_sequences": 3}, r"analyses.p.batch_sequences: expected a divisor of sequences_per_step \(2\)"),
        ({"spectrum": {"enabled": True}}, "analyses.p.spectrum: spectra of a training order's cases are not measured"),
    ):
        with pytest.raises(ValueError, match=message):
            WorkflowPlan(
                _analysis({"repo": "org/p", "revisions": {"min_step": 2}}) | {"analyses": {"p": {**entry, **change}}}
            )
    without = {**entry}
    del without["training_order"]
    with pytest.raises(ValueError, match=r"analyses.p.cases: recent, seen, unseen need the batches training took"):
        WorkflowPlan({"analyses": {"p": without}})
