"""The critical batch size from branch losses, its tables beside B_simple and B_noise, the figure,
and the experiment on two constructed cases whose answers the theory fixes: a noiseless corpus
(B_noise = 0; the smallest batch is best for a fixed token budget) and a noise-dominated one (the
critical batch size reaches the top of the grid)."""

import pandas as pd
import pytest
import torch

from tiny_llm.config import apply_overrides, config_from_dict, config_to_dict
from tiny_llm.curvature.hessian import Precision
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.data.preparation import prepare_cache
from tiny_llm.data.tokens import TokenCache, capacity_blocks, epoch_plan
from tiny_llm.model.checkpoint import load_weights
from tiny_llm.model.llama import Llama
from tiny_llm.results.cbs import BRANCH_COLUMNS, CBS_COLUMNS, cbs_tables, critical_batch, draw_cbs
from tiny_llm.training.branches import branch_overrides, held_out_blocks, held_out_loss, state_path
from tiny_llm.training.loop import train

GRID = (1, 2, 4, 8, 16)


def test_the_critical_batch_is_the_largest_within_epsilon_of_the_best():
    losses = {1: [2.0, 2.2], 2: [2.05, 2.05], 4: [2.3, 2.3], 8: [2.1, 2.1]}
    found = critical_batch(losses, 0.05)
    assert found["best_batch"] == 2 and found["best_loss"] == 2.05
    assert found["means"][1] == pytest.approx(2.1) and found["errors"][1] == pytest.approx(0.1)
    assert found["within"] == [1, 2, 8] and found["cbs"] == 8 and found["cbs_upper"] is None  # the grid's top
    tight = critical_batch(losses, 0.01)
    assert tight["within"] == [2] and (tight["cbs"], tight["cbs_upper"]) == (2, 4)
    assert critical_batch({4: [3.0], 8: [3.1]}, 0.01)["errors"][4] is None  # one seed: no error


def _record(checkpoint, step, losses):
    branches = [
        {"batch_size": b, "seed": s, "steps": 64 // b, "lr": 0.01 * b**0.5, "loss": loss}
        for b, values in losses.items()
        for s, loss in enumerate(values)
    ]
    return {"checkpoint": checkpoint, "step": step, "tokens": step * 1024, "branches": branches}


def test_tables_put_the_noise_scales_beside_it_in_sequences_and_tokens(tmp_path):
    records = [
        _record("epoch-002", 16, {4: [3.0, 3.02], 8: [3.01, 3.01], 16: [3.2, 3.2]}),
        _record("epoch-001", 8, {4: [3.5, 3.5], 8: [3.6, 3.6], 16: [3.7, 3.7]}),
    ]
    summary = pd.DataFrame(
        [
            ("epoch-001.safetensors", "seen", 2.0, 0.5, 1.5, 0.25),
            ("epoch-002.safetensors", "seen", 9.0, 1.0, None, None),
            ("epoch-002.safetensors", "unseen", 99.0, 1.0, 9.0, 1.0),
        ],
        columns=["file", "case", "b_simple", "b_simple_se", "b_noise", "b_noise_se"],
    )
    cbs, branches = cbs_tables(records, summary, "seen", 0.01, seq_len=64)
    assert [r["checkpoint"] for r in cbs] == ["epoch-001", "epoch-002"] and list(cbs[0]) == CBS_COLUMNS
    first, second = cbs
    assert (first["cbs"], first["cbs_upper"], first["cbs_tokens"], first["cbs_upper_tokens"]) == (4, 8, 256, 512)
    assert (first["b_simple_tokens"], first["b_noise_se_tokens"]) == (128.0, 16.0)
    assert (second["cbs"], second["cbs_upper"], second["b_simple"], second["b_noise"]) == (8, 16, 9.0, "")
    assert len(branches) == 6 and list(branches[0]) == BRANCH_COLUMNS
    row = branches[3]
    assert (row["checkpoint"], row["batch_size"], row["seeds"], row["steps"], row["within"]) == (
        "epoch-002",
        4,
        2,
        16,
        True,
    )
    assert row["loss"] == pytest.approx(3.01) and row["loss_se"] == pytest.approx(0.01)
    frames = (pd.DataFrame(cbs).replace("", None), pd.DataFrame(branches).replace("", None))
    draw_cbs(*frames, [tmp_path / "f.pdf", tmp_path / "f.png"], "title", 0.01, bottom=4)
    assert (tmp_path / "f.png").stat().st_size > 10_000 and (tmp_path / "f.pdf").exists()


def _experiment(tmp_path, corpus):
    """The experiment without the workflow: a base run (vocabulary 16, sequences of 6) keeping its
    state after epoch 1, branches of every batch size in GRID over 3 data orders for 16 sequences'
    tokens, their held-out losses, and B_simple and B_noise of the state on its training epoch."""
    T = 6
    config = config_from_dict(
        {
            "model": {"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "max_seq_len": 8},
            "data": {"cache": str(tmp_path / "cache"), "seq_len": T, "shuffle_group_blocks": 4, "seed": 3},
            "training": {
                "batch_size": 4, "micro_batch_size": 4, "tokens": 4 * T * 4 * 2, "epochs": 2, "lr": 0.01,
                "warmup_steps": 0, "lr_schedule": "constant", "checkpoint_policy": "interval", "keep_states": [1],
                "attention_backend": "reference",
            },
        }
    )  # fmt: skip
    blocks = capacity_blocks(config)["unseen"]
    ids = corpus(blocks * T + T + 1)
    prepare_cache(
        tmp_path / "cache", [ids.numpy()], tokenizer={"type": "external", "vocab_size": 16}, vocab_size=16,
        seq_len=T, shuffle_group_blocks=4, data_seed=3, prepare_train_tokens=blocks * T, shard_blocks=64,
        source={"kind": "test"},
    )  # fmt: skip
    train(config, tmp_path / "base")
    held_out, losses = held_out_blocks(config, 16), {}
    for batch in GRID:
        for seed in (1, 2, 3):
            overrides = branch_overrides(config, state_path(tmp_path / "base", 1), 1, batch, 16 * T, seed, "auto")
            branch = config_from_dict(
                apply_overrides(config_to_dict(config), [f"{k}={v}" for k, v in overrides.items()])
            )
            train(branch, tmp_path / f"b{batch}-s{seed}")
            final = tmp_path / f"b{batch}-s{seed}" / "final.pt"
            losses.setdefault(batch, []).append(held_out_loss(final, config, held_out))
    model = Llama(config.model, attention_backend="reference").double()
    model.load_state_dict(load_weights(tmp_path / "base" / "epoch-001.safetensors")[0])
    inputs = CaseInputs(
        cache=TokenCache(config.data.cache), plan=epoch_plan(config, 1), micro_batch_size=4, hvp_batch_size=4,
        noise_samples=None, random_samples=1, seed=1, engine="double_backward", directions_per_pass=4, compile=False,
    )  # fmt: skip
    statistics = measure_case(model, inputs, Precision(torch.device("cpu"), torch.float64))["statistics"]
    return critical_batch(losses, 0.01), statistics


def test_noiseless_data_the_smallest_batch_is_best(tmp_path):
    """Every sequence the same: every batch's gradient is the mean gradient (B_simple = B_noise = 0),
    so a fixed token budget is best spent on the most steps."""
    sequence = torch.randint(0, 16, (6,), generator=torch.Generator().manual_seed(1))
    found, statistics = _experiment(tmp_path, lambda n: sequence.repeat(n // 6 + 1)[:n])
    assert statistics["b_simple"] == 0 and statistics["b_noise"] == 0
    assert found["best_batch"] == 1 and found["cbs"] == 1 and found["within"] == [1]
    means = [found["means"][b] for b in GRID]
    assert means == sorted(means)  # each doubling of the batch costs loss


def test_noise_dominated_data_the_critical_batch_reaches_the_top_of_the_grid(tmp_path):
    """Uniformly random tokens: the mean gradient is small against the noise (B_noise far above the
    grid), so a larger batch loses nothing: every batch size is within ε of the best."""
    found, statistics = _experiment(
        tmp_path, lambda n: torch.randint(0, 16, (n,), generator=torch.Generator().manual_seed(1))
    )
    assert statistics["b_noise"] > 2 * max(GRID) and statistics["b_simple"] > max(GRID)
    assert found["cbs"] == max(GRID) and found["cbs_upper"] is None and found["within"] == list(GRID)
