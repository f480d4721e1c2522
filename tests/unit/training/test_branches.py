"""Branches: a run started from its parent's kept state continues it exactly at the parent's own
batch and rate; the learning-rate rules; refusals; the held-out loss; resumption."""

import json
import math

import pytest
import torch

from tiny_llm.config import apply_overrides, config_from_dict, config_to_dict
from tiny_llm.data.tokens import TokenCache, capacity_blocks, epoch_plan, unseen_plan
from tiny_llm.model.causal import token_losses
from tiny_llm.model.checkpoint import load_train_state, save_weights
from tiny_llm.model.llama import Llama
from tiny_llm.training.branches import (
    branch_overrides,
    held_out_blocks,
    held_out_loss,
    lr_factor,
    measure_branches,
    state_path,
)
from tiny_llm.training.loop import train


def _branch(parent, epoch, batch_size, tokens, seed, run_dir, rule="auto", region=0):
    overrides = branch_overrides(parent, state_path(run_dir, epoch), epoch, batch_size, tokens, (seed, region), rule)
    return config_from_dict(apply_overrides(config_to_dict(parent), [f"{k}={v}" for k, v in overrides.items()]))


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def parent(make_config, tmp_path):
    """A constant-rate run of 3 epochs × 3 steps that keeps its states after epochs 1 and 2."""
    config = make_config(epochs=3, tokens=4 * 8 * 3 * 3, warmup_steps=0, lr_schedule="constant", keep_states=[1, 2])
    train(config, tmp_path / "parent")
    return config


def test_a_branch_at_the_parents_batch_rate_and_seed_continues_it_exactly(parent, tmp_path):
    branch = _branch(parent, 1, 4, 2 * 3 * 4 * 8, parent.data.seed, tmp_path / "parent")
    assert branch.training.lr == parent.training.lr and branch.data.stream_offset == 12
    train(branch, tmp_path / "branch")
    ours, theirs = (load_train_state(tmp_path / d / "final.pt") for d in ("branch", "parent"))
    assert _equal(ours["model"], theirs["model"])
    saved = [s["workers"][0]["optimizer"]["state"] for s in (ours, theirs)]
    assert all(_equal(saved[0][i], saved[1][i]) for i in saved[1])
    logs = [
        [json.loads(line) for line in (tmp_path / d / "train-log.jsonl").read_text().splitlines()]
        for d in ("parent", "branch")
    ]
    assert [r["loss"] for r in logs[1]] == [r["loss"] for r in logs[0][3:]]


def test_a_killed_branch_resumes_to_the_same_files(parent, tmp_path):
    branch = _branch(parent, 1, 2, 2 * 3 * 4 * 8, 11, tmp_path / "parent")
    assert branch.training.epochs == 4 and branch.training.micro_batch_size == 2
    train(branch, tmp_path / "whole")
    train(branch, tmp_path / "split", stop_after_epoch=2)
    assert (tmp_path / "split" / "resume.pt").exists()
    train(branch, tmp_path / "split")
    whole, split = (load_train_state(tmp_path / d / "final.pt") for d in ("whole", "split"))
    assert _equal(whole["model"], split["model"])


def test_learning_rate_rules(parent):
    assert lr_factor("auto", "adamw", 4) == 2 and lr_factor("auto", "sgd", 4) == 4
    assert lr_factor("sqrt", "sgd", 2) == math.sqrt(2) and lr_factor("none", "adamw", 8) == 1
    wide = branch_overrides(parent, "s.pt", 2, 16, 16 * 8, (1, 0), "auto")
    assert wide["training.lr"] == pytest.approx(2 * parent.training.lr)
    assert wide["data.stream_offset"] == 24 and wide["training.epochs"] == 1


def test_a_branch_from_a_state_its_parent_did_not_keep_is_refused(parent, tmp_path):
    branch = _branch(parent, 0, 4, 4 * 8, 1, tmp_path / "parent")
    with pytest.raises(ValueError, match=r"training.init_from: .*state-000.pt does not exist; .*keep_states"):
        train(branch, tmp_path / "orphan")
    assert not (tmp_path / "orphan").exists()  # refused before anything is written


def test_held_out_loss_is_the_token_mean_loss_on_the_unseen_stream(parent, tmp_path):
    blocks = held_out_blocks(parent, 5)
    assert blocks == [int(b) for b in unseen_plan(parent).blocks.reshape(-1)[:5]]
    assert min(blocks) >= capacity_blocks(parent)["train"]
    model = Llama(parent.model, attention_backend="reference").double()
    model.load_state_dict(load_train_state(tmp_path / "parent" / "final.pt")["model"])
    tokens = TokenCache(parent.data.cache).tokens(blocks)
    with torch.no_grad():
        expected = float(token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean())
    assert held_out_loss(tmp_path / "parent" / "final.pt", parent, blocks) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="eval_sequences: 999 held-out sequences"):
        held_out_blocks(parent, 999)
    diverged = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}
    save_weights(tmp_path / "diverged.safetensors", diverged, {"format": "tiny_llm.weights/1"})
    assert held_out_loss(tmp_path / "diverged.safetensors", parent, blocks) == math.inf
    wrong = {**model.state_dict(), "extra.weight": torch.zeros(2)}
    save_weights(tmp_path / "wrong.safetensors", wrong, {"format": "tiny_llm.weights/1"})
    with pytest.raises(ValueError, match="extra.weight"):
        held_out_loss(tmp_path / "wrong.safetensors", parent, blocks)


def _read(config):
    """Every cache block a run trains on, in its order."""
    return [int(b) for e in range(1, config.training.epochs + 1) for b in epoch_plan(config, e).blocks.reshape(-1)]


def test_each_data_seed_reads_its_own_sequences_the_same_at_every_batch_size(make_config, tmp_path):
    """Seeds draw different sequences (not only reorder them), every batch size of a seed reads the
    same ones, and no branch reads what the parent trained on before the branch point, though the
    branch point (5 sequences) is not a whole shuffle group (4)."""
    parent = make_config(batch_size=5, micro_batch_size=5, epochs=4, tokens=5 * 8 * 2 * 4, warmup_steps=0)
    trained = set(_read(parent)[:10])  # epoch 1: two steps of 5 sequences
    seen = {}
    for seed, region in ((11, 0), (12, 1)):
        for batch in (1, 2, 4):
            branch = _branch(parent, 1, batch, 4 * 8 * 4, seed, tmp_path, region=region)
            assert branch.data.stream_offset == 12 + 16 * region  # 10 read, rounded up to groups of 4
            seen.setdefault(seed, []).append(set(_read(branch)))
    for seed, sets in seen.items():
        assert all(s == sets[0] for s in sets) and len(sets[0]) == 16 and not sets[0] & trained, seed
    assert not seen[11][0] & seen[12][0]


def test_a_branch_from_warm_up_takes_the_rate_after_it(make_config):
    config = make_config(epochs=3, tokens=4 * 8 * 3 * 3, warmup_steps=4, lr_schedule="constant")
    overrides = branch_overrides(config, "s.pt", 0, 4, 4 * 8 * 4, (1, 0), "none")
    assert overrides["training.lr"] == pytest.approx(config.training.lr)  # not the first warm-up step's
    assert overrides["training.checkpoint_policy"] == "interval"


def test_a_branch_record_holds_each_branch_loss_curve(parent, tmp_path, monkeypatch):
    branch = _branch(parent, 1, 2, 4 * 2 * 8, 11, tmp_path / "parent")
    monkeypatch.chdir(tmp_path)
    train(branch, tmp_path / "runs" / "b")
    blocks = held_out_blocks(parent, 4)
    spec = {
        "checkpoint": "epoch-001", "step": 3, "tokens": 96, "state": str(tmp_path / "parent" / "state-001.pt"),
        "token_budget": 64, "base": config_to_dict(parent), "blocks": blocks, "device": "cpu",
        "branches": {"b": {"batch_size": 2, "seed": 11, "steps": 4, "lr": 0.01, "points": 4}},
    }  # fmt: skip
    record = measure_branches(spec)
    (curve,) = [b["curve"] for b in record["branches"]]
    assert [t for t, _ in curve] == [0, 16, 32, 48, 64]
    assert curve[0][1] == record["start_loss"] == held_out_loss(tmp_path / "parent" / "state-001.pt", parent, blocks)
    assert curve[-1][1] == record["branches"][0]["loss"]
    assert record["branches"][0]["loss"] == pytest.approx(held_out_loss(tmp_path / "runs/b/final.pt", parent, blocks))
