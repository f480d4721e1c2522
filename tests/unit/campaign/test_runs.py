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
from hf_hub import cache_revision, neox_suite


@pytest.fixture
def project(tmp_path, monkeypatch):
    folders = neox_suite(tmp_path / "saved", (0, 1, 2, 4))
    for step, folder in folders.items():
        cache_revision(tmp_path / "hf", "org/p", f"step{step}", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text(
        "data: {cache: cache/p, seq_len: 8, shuffle_group_blocks: 4}\n"
        "training: {batch_size: 2, micro_batch_size: 2, tokens: 32, epochs: 1}\n"
    )
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
