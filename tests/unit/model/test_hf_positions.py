"""Where each imported checkpoint stands in its training: its step and tokens given, read from a
Trainer's trainer_state.json, read from a hub revision's name, derived, or unknown; and the
Trainer's training log."""

import json
import math

import pytest

from tiny_llm.model.hf_positions import CheckpointSource, checkpoint_positions, read_trainer_state, trainer_log


def _trainer(folder, step, **state):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, **state}))
    return folder


def test_steps_and_tokens_come_from_what_is_given_then_the_trainer_then_the_revision_name(tmp_path):
    given = CheckpointSource(tmp_path / "a", step=10, tokens=40)
    trainer = CheckpointSource(_trainer(tmp_path / "b", 20, num_input_tokens_seen=80))
    named = CheckpointSource(tmp_path / "c", tokens=4 * 10**9 * 30, revision="stage1-step30-tokens120B")
    a, b, c = checkpoint_positions([given, trainer, named])
    assert (a.step, a.step_source, a.tokens, a.tokens_source) == (10, "given", 40, "given")
    assert (b.step, b.tokens) == (20, 80) and b.tokens_source == "trainer_state.json num_input_tokens_seen"
    assert c.step == 30 and c.tokens == 120 * 10**9 and c.step_source == "revision name stage1-step30-tokens120B"
    by_step = checkpoint_positions([CheckpointSource(tmp_path / "f", revision="step30-tokens126M")], 4_194_304)[0]
    assert by_step.tokens == 30 * 4_194_304 and by_step.tokens_source == "step x tokens_per_step (4194304)"
    derived = checkpoint_positions([CheckpointSource(tmp_path / "d", step=3)], tokens_per_step=16)[0]
    assert derived.tokens == 48 and derived.tokens_source == "step x tokens_per_step (16)"
    alone = checkpoint_positions([CheckpointSource(tmp_path / "e")])[0]
    assert (alone.step, alone.step_source, alone.tokens) == (0, "unknown", None)


def test_positions_that_contradict_or_come_out_of_order_are_refused(tmp_path):
    with pytest.raises(ValueError, match="its training step is unknown"):
        checkpoint_positions([CheckpointSource(tmp_path / "a"), CheckpointSource(tmp_path / "b", step=2)])
    with pytest.raises(ValueError, match=r"checkpoints out of training order: .*b \(step 1\) comes after"):
        checkpoint_positions([CheckpointSource(tmp_path / "a", step=2), CheckpointSource(tmp_path / "b", step=1)])
    with pytest.raises(ValueError, match="but its tokens are given as 5"):
        checkpoint_positions([CheckpointSource(tmp_path / "a", step=2, tokens=5)], tokens_per_step=4)
    with pytest.raises(ValueError, match="is given twice"):
        checkpoint_positions([CheckpointSource(tmp_path / "a", step=1), CheckpointSource(tmp_path / "a", step=2)])
    with pytest.raises(ValueError, match="global_step 'x' is not a non-negative integer"):
        read_trainer_state(_trainer(tmp_path / "bad", "x"))
    assert read_trainer_state(tmp_path / "none") is None


def test_the_trainer_log_is_the_newest_checkpoints_training_entries(tmp_path):
    history = [
        {"step": 1, "loss": 3.0, "learning_rate": 1e-3, "grad_norm": 2.0, "epoch": 0.1},
        {"step": 1, "eval_loss": 2.9},  # an evaluation entry: not a training record
        {"step": 2, "loss": float("nan"), "num_input_tokens_seen": 64},
    ]
    old = _trainer(tmp_path / "old", 1, log_history=history[:1])
    new = _trainer(tmp_path / "new", 2, log_history=history)
    file, records = trainer_log([old, new], tokens_per_step=16)
    assert file == new / "trainer_state.json" and [r["step"] for r in records] == [1, 2]
    assert records[0]["tokens"] == 16 and records[0]["lr"] == 1e-3 and records[0]["grad_norm_kind"] == "pre_clip"
    assert records[1]["tokens"] == 64 and math.isnan(records[1]["loss"])  # a diverged step stays NaN
    assert trainer_log([tmp_path / "missing"]) is None
    _trainer(tmp_path / "late", 1, log_history=[{"step": 5, "loss": 1.0}])
    with pytest.raises(ValueError, match="past the global_step 1"):
        trainer_log([tmp_path / "late"])


def test_tokens_are_never_a_revision_names_rounded_count(tmp_path):
    """An OLMo-style suite whose names round their tokens (step 4 says 0 thousand, steps 8 and 16
    one thousand: 68 a step) is refused naming tokens_per_step, never drawn on that axis; with
    tokens_per_step each checkpoint's tokens are step × it, checked against its name; tokens that
    do not increase with the step are refused, naming both checkpoints."""
    names = [f"step{s}-tokens{round(68 * s / 1000)}K" for s in (4, 8, 16)]
    sources = [CheckpointSource(tmp_path / n, revision=n) for n in names]
    with pytest.raises(ValueError, match=r"step4-tokens0K states its tokens only rounded .* give tokens_per_step"):
        checkpoint_positions(sources)
    assert [p.tokens for p in checkpoint_positions(sources, tokens_per_step=68)] == [272, 544, 1088]
    with pytest.raises(ValueError, match=r"puts revision step4-tokens0K at 800 tokens, but its name says 0 \(± 500\)"):
        checkpoint_positions(sources, tokens_per_step=200)
    flat = [CheckpointSource(tmp_path / "a", step=1, tokens=10), CheckpointSource(tmp_path / "b", step=2, tokens=10)]
    with pytest.raises(ValueError, match=r"training tokens do not increase with the step: .*b \(step 2, 10 tokens"):
        checkpoint_positions(flat)
