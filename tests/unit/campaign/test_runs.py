"""The workflow's imports of suites trained elsewhere, as downloaded: an analysis's hf_checkpoints
given as a repository and a selection of its revisions in the local Hugging Face cache plan with
each revision's folder, its step from its name and tokens from tokens_per_step; what is not in the
cache is refused at start-up, naming the key and the command that fetches it."""

import pytest

from tiny_llm.campaign.workflow import WorkflowPlan


def test_a_suite_of_cached_revisions_plans_with_their_steps(project, suite_analysis):
    plan = WorkflowPlan(suite_analysis({"repo": "org/p", "revisions": {"min_step": 1}}))
    positions = plan.runs.positions["p"]
    assert [(p.step, p.step_source, p.tokens) for p in positions] == [
        (1, "revision name step1", 16),
        (2, "revision name step2", 32),
        (4, "revision name step4", 64),
    ]
    spec = plan.runs.import_spec("p")
    assert spec["hub"] == [["org/p", "step1"], ["org/p", "step2"], ["org/p", "step4"]]
    assert all("/snapshots/" in d for d in spec["directories"])
    listed = WorkflowPlan(suite_analysis([{"repo": "org/p", "revision": "step4"}]))
    assert [p.step for p in listed.runs.positions["p"]] == [4]


def test_a_revision_not_in_the_cache_is_refused_at_start_up(project, suite_analysis):
    with pytest.raises(ValueError, match=r"analyses.p.hf_checkpoints: step3 not in the local cache .* hf download"):
        WorkflowPlan(suite_analysis({"repo": "org/p", "revisions": ["step1", "step3"]}))
    with pytest.raises(ValueError, match=r"analyses.p.hf_checkpoints: org/q has no named revision in the local"):
        WorkflowPlan(suite_analysis({"repo": "org/q"}))


def test_a_refusal_names_a_revision_as_the_configuration_does(project, suite_analysis):
    """A bad file in a revision's snapshot folder is named by repository and revision, not only by
    the snapshot's hash; a config.json without model_type is one line, not a traceback."""
    import json

    from tiny_llm.model.hub import resolve_revision

    snapshot = resolve_revision("org/p", "step2", project / "hf")
    data = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").unlink()  # a symlink to its blob: replaced, the other revisions keep theirs
    (snapshot / "config.json").write_text(json.dumps({k: v for k, v in data.items() if k != "model_type"}))
    with pytest.raises(
        ValueError,
        match=r"analyses.p.hf_checkpoints: org/p revision step2 at .*snapshots.*config.json differs from org/p "
        r"revision step0 at .*snapshots.*config.json \(in model_type\)",
    ):
        WorkflowPlan(suite_analysis({"repo": "org/p", "revisions": "all"}))
    with pytest.raises(ValueError, match=r"org/p revision step2 at .*config.json: model_type=None: no model type"):
        WorkflowPlan(suite_analysis({"repo": "org/p", "revisions": ["step2"]}))
