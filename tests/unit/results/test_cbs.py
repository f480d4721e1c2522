"""The critical batch size from branch loss curves, three ways beside B_simple and B_noise, the
figure, and the experiment on two constructed cases whose answers the theory fixes: a noiseless
corpus (B_noise = 0; the smallest batch is best for a fixed token budget, B_crit ≈ 0) and a
noise-dominated one (B* reaches the top of the grid, B_crit above it)."""

import pandas as pd
import pytest
import torch

from tiny_llm.config import apply_overrides, config_from_dict, config_to_dict
from tiny_llm.curvature.hessian import Precision
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.data.preparation import Blocking, prepare_cache
from tiny_llm.data.tokens import TokenCache, capacity_blocks, unseen_plan
from tiny_llm.model.checkpoint import load_weights
from tiny_llm.model.llama import Llama
from tiny_llm.results.cbs import (
    BRANCH_COLUMNS,
    CBS_COLUMNS,
    CURVE_COLUMNS,
    FIT_COLUMNS,
    RATE_COLUMNS,
    TARGETS,
    cbs_tables,
    checkpoint_rows,
    relative_rule,
)
from tiny_llm.training.branches import branch_overrides, held_out_blocks, measure_branches, state_path
from tiny_llm.training.loop import train

GRID = (1, 2, 4, 8)
SCALES = ("b_simple", "b_simple_se", "b_noise", "b_noise_se")


def test_the_relative_rule_keeps_its_own_name():
    assert relative_rule({1: 2.1, 2: 2.05, 4: 2.3, 8: 2.1}, 0.05) == 8
    assert relative_rule({1: 2.1, 2: 2.05, 4: 2.3, 8: 2.1}, 0.01) == 2


def _record(checkpoint, step, finals, start=4.0):
    """A checkpoint's record: each batch's branches fall linearly from ``start`` to their final
    losses (one per seed) over a budget of 1,024 tokens."""
    branches = [
        {
            "batch_size": b, "seed": s, "steps": 64 // b, "lr": 0.01 * b**0.5, "loss": loss,
            "curve": [[t, start - (start - loss) * t / 1024] for t in (0, 256, 512, 768, 1024)],
        }
        for b, values in finals.items()
        for s, loss in enumerate(values, start=1)
    ]  # fmt: skip
    return {"checkpoint": checkpoint, "step": step, "tokens": step * 1024, "start_loss": start, "branches": branches}


def test_every_answer_at_each_batchs_best_rate_and_at_the_rules():
    """A grid of three rates: the tuned answers read each batch's best rate by the seed-paired mean
    (batch 4 at 2 × the rule's, at the grid's edge: flagged; batch 8 at the rule's own); the rule's
    answers read the rule's rate alone, as if nothing else had been trained; the rates table pairs
    every rate with the rule's by seed."""
    finals = {1.0: {4: [3.0, 3.02], 8: [3.01, 3.03]}, 2.0: {4: [2.9, 2.94], 8: [3.11, 3.13]}}
    finals[0.5] = {4: [3.1, 3.1], 8: [3.05, 3.06]}
    record = _record("epoch-001", 8, finals[1.0])
    for factor in (0.5, 2.0):
        extra = _record("epoch-001", 8, finals[factor])["branches"]
        record["branches"] += [{**b, "lr_factor": factor, "lr": factor * b["lr"]} for b in extra]
    alone = _record("epoch-001", 8, finals[1.0])
    found = checkpoint_rows(record, dict.fromkeys(SCALES), 0.01, base=4)
    plain = checkpoint_rows(alone, dict.fromkeys(SCALES), 0.01, base=4)
    assert sorted(found) == ["rates", "rule", "tuned"] and sorted(plain) == ["rates", "rule"]
    assert {k: v for k, v in found["rule"]["row"].items() if k != "lr_edge"} == {
        k: v for k, v in plain["rule"]["row"].items() if k != "lr_edge"
    }
    tuned = found["tuned"]
    assert [(b["batch_size"], b["lr_factor"], b["lr_edge"]) for b in tuned["branches"]] == [
        (4, 2.0, True),
        (8, 1.0, False),
    ]
    assert tuned["row"]["lr_edge"] == "4" and tuned["row"]["rates"] == "tuned"
    assert tuned["branches"][1]["difference"] == pytest.approx(3.02 - 2.92)  # 8 at its best against 4 at its best
    rows = found["rates"]
    assert [(r["batch_size"], r["lr_factor"], r["best"]) for r in rows] == [
        (4, 0.5, False), (4, 1.0, False), (4, 2.0, True), (8, 0.5, False), (8, 1.0, True), (8, 2.0, False),
    ]  # fmt: skip
    assert rows[2]["difference"] == pytest.approx(-0.09)
    assert rows[2]["difference_half_width"] == pytest.approx(12.706 * 0.01, rel=1e-3)
    assert rows[5]["difference"] == pytest.approx(0.1) and list(plain["rates"][0]) == list(rows[0])


def test_tables_put_the_three_answers_beside_the_noise_scales(tmp_path):
    records = [
        _record("epoch-002", 16, {4: [3.0, 3.02], 8: [3.005, 3.025], 16: [3.2, 3.22]}),
        _record("epoch-001", 8, {4: [3.5, 3.5], 8: [3.6, 3.6], 16: [3.7, 3.7]}),
    ]
    summary = pd.DataFrame(
        [
            ("epoch-001.safetensors", "unseen", 2.0, 0.5, 1.5, 0.25),
            ("epoch-002.safetensors", "unseen", 9.0, 1.0, None, None),
            ("epoch-002.safetensors", "seen", 99.0, 1.0, 9.0, 1.0),
        ],
        columns=["file", "case", "b_simple", "b_simple_se", "b_noise", "b_noise_se"],
    )
    tables = cbs_tables(records, summary, "unseen", 0.01, seq_len=64, base=4)
    cbs, branches, fits, curves = (tables[k] for k in ("cbs", "branches", "fits", "curves"))
    assert [r["checkpoint"] for r in cbs] == ["epoch-001", "epoch-002"] and list(cbs[0]) == CBS_COLUMNS
    assert [r["rates"] for r in cbs] == ["rule", "rule"] and list(tables["rates"][0]) == RATE_COLUMNS
    first, second = cbs
    # epoch 1: 8 is 0.1 above 4 (seeds agree exactly): B* = 4, bounded by 8
    assert (first["cbs"], first["cbs_high"], first["cbs_tokens"], first["cbs_high_tokens"]) == (4, 8, 256, 512)
    assert (first["b_simple_tokens"], first["case"], first["relative_cbs"]) == (128.0, "unseen", 4)
    assert first["b_noise_cbs"] >= 4 and first["b_noise_cbs_grid"] == 4
    assert first["b_noise_cbs_low"] <= first["b_noise_cbs"] <= first["b_noise_cbs_high"]
    assert first["b_noise_cbs_agrees"] is (first["b_noise_cbs_low"] < 8) and first["b_simple_cbs"] >= 4
    assert first["agreeing_scale_low"] <= first["b_noise"] or not first["b_noise_cbs_agrees"]
    assert (first["cbs_comparisons"], first["cbs_joint"], first["seeds"]) == (3, 0.95, 2)
    assert first["paired_spread"] == pytest.approx(0.0, abs=1e-12) and first["seeds_needed"] == 2
    # epoch 2: 8 is 0.005 above 4 for both seeds: within ε by its interval too
    assert (second["cbs"], second["cbs_high"], second["b_simple"], second["b_noise"]) == (8, 16, 9.0, "")
    assert second["b_noise_cbs"] == "" and second["b_crit"] != ""
    assert len(branches) == 6 and list(branches[0]) == BRANCH_COLUMNS
    row = branches[4]
    wanted = ("epoch-002", 8, 2, 8, True)
    assert (row["checkpoint"], row["batch_size"], row["seeds"], row["steps"], row["within"]) == wanted
    assert row["loss"] == pytest.approx(3.015) and row["difference"] == pytest.approx(0.005)
    assert row["difference_half_width"] == pytest.approx(0.0, abs=1e-12)
    assert list(fits[0]) == FIT_COLUMNS and len(fits) == 2 * len(TARGETS)
    assert list(curves[0]) == CURVE_COLUMNS and len(curves) == 2 * 6 * 5


def _experiment(tmp_path, monkeypatch, corpus, rule="auto", epsilon=0.01):
    """The experiment without the workflow: a base run (vocabulary 16, sequences of 6, batch 4)
    keeping its state after epoch 1; branches of every batch size in GRID over 3 data seeds, each
    seed its own 32 sequences, at the learning rate ``rule``; their held-out loss curves; B_simple
    and B_noise of the state on fresh (unseen) data; and the checkpoint's answers."""
    T, seeds, budget, epoch = 6, (1, 2, 3), 32 * 6, 1
    config = config_from_dict(
        {
            "model": {"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "max_seq_len": 8},
            "data": {"cache": str(tmp_path / "cache"), "seq_len": T, "shuffle_group_blocks": 4, "seed": 3},
            "training": {
                "batch_size": 4, "micro_batch_size": 4, "tokens": 4 * T * 12 * 3, "epochs": 3, "lr": 0.01,
                "warmup_steps": 0, "lr_schedule": "constant", "checkpoint_policy": "interval", "keep_states": [epoch],
                "attention_backend": "reference",
            },
        }
    )  # fmt: skip
    blocks = capacity_blocks(config)["unseen"]
    ids = corpus(blocks * T + T + 1)
    prepare_cache(
        tmp_path / "cache", [ids.numpy()], tokenizer={"type": "external", "vocab_size": 16}, vocab_size=16,
        blocking=Blocking(
            seq_len=T, shuffle_group_blocks=4, data_seed=3, prepare_train_tokens=blocks * T, shard_blocks=64
        ),
        source={"kind": "test"},
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    train(config, tmp_path / "runs" / "base")
    branches = {}
    for batch in GRID:
        for region, seed in enumerate(seeds):
            state = state_path("runs/base", epoch)
            overrides = branch_overrides(config, state, epoch, batch, budget, (seed, region), rule)
            branch = config_from_dict(
                apply_overrides(config_to_dict(config), [f"{k}={v}" for k, v in overrides.items()])
            )
            train(branch, tmp_path / "runs" / f"b{batch}-s{seed}")
            info = {"batch_size": batch, "seed": seed, "steps": budget // T // batch, "lr": branch.training.lr}
            branches[f"b{batch}-s{seed}"] = {**info, "points": branch.training.epochs}
    spec = {
        "checkpoint": f"epoch-{epoch:03d}", "step": 12 * epoch, "tokens": 12 * epoch * 4 * T, "state": state,
        "token_budget": budget, "base": config_to_dict(config), "blocks": held_out_blocks(config, 48),
        "device": "cpu", "branches": branches,
    }  # fmt: skip
    model = Llama(config.model, attention_backend="reference").double()
    model.load_state_dict(load_weights(tmp_path / f"runs/base/epoch-{epoch:03d}.safetensors")[0])
    inputs = CaseInputs(
        cache=TokenCache(config.data.cache), plan=unseen_plan(config), micro_batch_size=4, hvp_batch_size=4,
        noise_samples=None, random_samples=1, seed=1, engine="double_backward", directions_per_pass=4, compile=False,
    )  # fmt: skip
    scales = measure_case(model, inputs, Precision(torch.device("cpu"), torch.float64))["statistics"]
    found = checkpoint_rows(measure_branches(spec), {k: scales.get(k) for k in SCALES}, epsilon, base=4)
    return found, scales


def test_noiseless_data_the_smallest_batch_is_best(tmp_path, monkeypatch):
    """Every sequence the same: every batch's gradient is the mean gradient (B_simple = B_noise = 0),
    so a token budget is best spent on the most steps: B* is the base batch (the next is out of ε
    by its whole interval), B_crit ≈ 0, and B_noise predicts no larger batch. Every branch takes
    the same rate (the √ rule would give larger batches larger steps, another question), so each
    step is the same at every batch size and the tokens needed grow as B exactly."""
    sequence = torch.randint(0, 16, (6,), generator=torch.Generator().manual_seed(1))
    found, scales = _experiment(tmp_path, monkeypatch, lambda n: sequence.repeat(n // 6 + 1)[:n], rule="none")
    found = found["rule"]
    row = found["row"]
    assert scales["b_simple"] == pytest.approx(0, abs=1e-20) and scales["b_noise"] == pytest.approx(0, abs=1e-20)
    assert (row["cbs"], row["cbs_point"], row["cbs_high"]) == (4, 4, 8)
    fitted = [f for f in found["fits"] if f["b_crit"] is not None]  # where 3+ batch sizes reach the target
    assert fitted and all(f["b_crit"] < 0.1 and f["high"] < 0.1 for f in fitted)  # 0 but for interpolation
    assert row["b_noise_cbs"] == pytest.approx(4, abs=0.5) and row["b_noise_cbs_grid"] == 4
    means = [b["loss"] for b in found["branches"]]
    assert means == sorted(means)  # each doubling of the batch costs loss


def test_noise_dominated_data_the_critical_batch_reaches_the_top_of_the_grid(tmp_path, monkeypatch):
    """Uniformly random tokens: the mean gradient is small against the noise (B_simple and B_noise
    far above the grid), so a larger batch loses nothing: B* is the grid's top and not bounded above
    by it. There is nothing to learn but noise, so no branch lowers the held-out loss and no target
    is reached: no finite B_crit (its limit is ∞). Three seeds of 48 held-out sequences resolve
    differences of about 0.01 nats here, so the tolerance is set above that, at 0.05."""
    found, scales = _experiment(
        tmp_path,
        monkeypatch,
        lambda n: torch.randint(0, 16, (n,), generator=torch.Generator().manual_seed(1)),
        epsilon=0.05,
    )
    found = found["rule"]
    row = found["row"]
    assert scales["b_noise"] > 2 * max(GRID) and scales["b_simple"] > 2 * max(GRID)
    assert (row["cbs"], row["cbs_point"], row["cbs_high"]) == (max(GRID), max(GRID), None)
    assert all(b["loss"] >= row["start_loss"] for b in found["branches"]) and row["b_crit"] is None
    assert row["b_noise_cbs_grid"] == max(GRID)


def test_a_diverged_branch_counts_as_worse_than_any_that_trained():
    """Batch 8 at twice the rule's rate diverged (NaN): the tuned answers take another rate for it,
    and at the rule's rate a diverged batch 8 is out of ε, never within it."""
    record = _record("epoch-001", 8, {4: [3.0, 3.02], 8: [3.001, 3.021]})
    for factor, finals in ((0.5, {4: [3.1, 3.1], 8: [3.05, 3.06]}), (2.0, {4: [3.2, 3.2], 8: [3.0, 3.0]})):
        extra = _record("epoch-001", 8, finals)["branches"]
        record["branches"] += [{**b, "lr_factor": factor} for b in extra]
    for branch in record["branches"]:
        if branch["batch_size"] == 8 and branch.get("lr_factor") == 2.0:
            branch["loss"], branch["curve"][-1][1] = float("nan"), None  # a record writes null
    found = checkpoint_rows(record, dict.fromkeys(SCALES), 0.01, base=4)
    assert [b["lr_factor"] for b in found["tuned"]["branches"]] == [1.0, 1.0]
    diverged = {
        **record,
        "branches": [{**b, "lr_factor": 1.0} for b in record["branches"] if b.get("lr_factor") == 2.0],
    }
    rule = checkpoint_rows(diverged, dict.fromkeys(SCALES), 0.01, base=4)["rule"]
    assert rule["row"]["cbs"] == 4 and rule["branches"][1]["loss"] == float("inf")
