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


def test_a_training_order_analysis_never_reads_data_cache_so_another_tokenizers_is_no_refusal(project, monkeypatch):
    """The documented minimal run configuration (data.seq_len, training.micro_batch_size) leaves
    data.cache at the demo's byte-level cache: an analysis on a training order does not read it, so a
    demo run beside it is no reason to refuse; the offset case, which reads it, is still checked."""
    import json

    import numpy as np

    import tiny_llm.campaign.runs as runs
    from tiny_llm.data.training_order import write_megatron

    carried = {"type": "huggingface", "path": "elsewhere", "vocab_size": 64, "sha256": "0" * 64}
    monkeypatch.setattr(runs, "checkpoint_tokenizer", lambda paths, vocab: carried)
    (project / "cache/demo").mkdir(parents=True)
    (project / "cache/demo/meta.json").write_text(json.dumps({"tokenizer": {"type": "byte", "vocab_size": 256}}))
    (project / "minimal.yaml").write_text("data: {seq_len: 8}\ntraining: {micro_batch_size: 2}\n")
    write_megatron(project / "document", np.random.default_rng(0).integers(0, 64, size=(20, 9)).astype(np.uint16))
    entry = {"config": "minimal.yaml", "hf_checkpoints": {"repo": "org/p", "revisions": {"min_step": 1}}}
    entry |= {"tokens_per_step": 16, "cases": ["seen"], "case_steps": 1}
    entry["training_order"] = {"path": "document", "format": "megatron", "sequences_per_step": 2}
    WorkflowPlan({"analyses": {"p": entry}})
    with pytest.raises(ValueError, match=r"analyses.p.config: the checkpoints carry .* but data.cache cache/demo was"):
        WorkflowPlan({"analyses": {"p": {**entry, "cases": ["offset"]}}})


def test_a_suite_on_its_training_order_takes_tokens_per_step_from_the_order(project):
    """Without tokens_per_step, an analysis on a published order counts a step's tokens from it:
    sequences_per_step × the tokens each sequence trains (data.seq_len: 9-token sequences train 8)."""
    import numpy as np

    from tiny_llm.data.training_order import write_megatron

    (project / "minimal.yaml").write_text("data: {seq_len: 8}\ntraining: {micro_batch_size: 2}\n")
    write_megatron(project / "document", np.random.default_rng(0).integers(0, 64, size=(20, 9)).astype(np.uint16))
    entry = {"config": "minimal.yaml", "hf_checkpoints": {"repo": "org/p", "revisions": {"min_step": 1}}}
    entry |= {"cases": ["seen"], "training_order": {"path": "document", "format": "megatron", "sequences_per_step": 2}}
    plan = WorkflowPlan({"analyses": {"p": entry}})
    assert [(p.step, p.tokens) for p in plan.runs.positions["p"]] == [(1, 16), (2, 32), (4, 64)]
    assert plan.runs.import_spec("p")["tokens_per_step"] == 16  # what the import writes
    assert "analyses.p.tokens_per_step: 16 from its training_order (2 sequences a step × 8 trained tokens each)" in (
        plan.runs.notes
    )


def test_an_import_refusal_names_the_revision_as_written_not_its_snapshot(project):
    """Weights found bad only by the import (a truncated file) are named by repository and revision."""
    from tiny_llm.config import config_from_dict
    from tiny_llm.model.hf_positions import CheckpointSource
    from tiny_llm.model.hf_runs import import_run
    from tiny_llm.model.hub import resolve_revision

    snapshot = resolve_revision("org/p", "step2", project / "hf")
    weights = next(p for p in snapshot.iterdir() if p.suffix in (".safetensors", ".bin"))
    data = weights.read_bytes()
    weights.unlink()  # a symlink to its blob: replaced, the other revisions keep theirs
    weights.write_bytes(data[: len(data) // 2])
    sources = [CheckpointSource(snapshot, repo="org/p", revision="step2")]
    with pytest.raises(ValueError, match=rf"org/p revision step2 at {snapshot}"):
        import_run(sources, project / "runs/p", config_from_dict({"data": {"seq_len": 8}}), tokens_per_step=16)
    assert not (project / "runs/p").exists()
