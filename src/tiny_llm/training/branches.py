"""Branches of a training run: ordinary runs that start from a state their parent kept
(``training.keep_states`` → ``state-NNN.pt``; the branch's ``training.init_from``) and train on with
their own batch size and learning rate for a fixed token budget, reading the parent's training
stream where the parent stopped (``data.stream_offset``) in their own data order (``data.seed``).
The critical-batch-size experiment (:mod:`tiny_llm.campaign.cbs`) runs them and compares the loss
they reach on the parent's held-out data (:func:`held_out_loss`).

A branch at the parent's own batch size, learning rate (a constant schedule) and data seed
continues the parent exactly: same weights, optimizer state and log.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from tiny_llm.config import RunConfig, config_from_dict
from tiny_llm.data.tokens import TokenCache, unseen_plan, whole_groups
from tiny_llm.layout import epoch_stem, state_file
from tiny_llm.training.schedule import learning_rate

__all__ = [
    "BRANCH_EPOCHS",
    "branch_overrides",
    "branch_region",
    "held_out_blocks",
    "held_out_loss",
    "load_start",
    "measure_branches",
    "lr_factor",
    "memory_betas",
    "state_path",
]

EVAL_TOKENS = 4096
"""Tokens a held-out loss's forward pass takes at once (at least a training micro-batch)."""
BRANCH_EPOCHS = 4
"""A branch saves its resume state at most this many times (each quarter of its budget when its
steps allow), so that a killed branch loses at most that much."""


def lr_factor(rule: Literal["auto", "sqrt", "linear", "none"], optimizer: str, ratio: float) -> float:
    """The learning-rate multiplier of a branch whose batch B' is ``ratio`` × its parent's B: ``sqrt``
    √(B'/B) (Adam, as Merrill et al. 2025), ``linear`` B'/B (SGD), ``none`` 1; ``auto``: sqrt for
    adamw, linear for sgd."""
    if rule == "auto":
        rule = "sqrt" if optimizer == "adamw" else "linear"
    return {"sqrt": math.sqrt(ratio), "linear": ratio, "none": 1.0}[rule]


def memory_betas(parent: RunConfig, batch_size: int, memory: Literal["steps", "tokens"]) -> dict[str, float]:
    """Adam's β1 and β2 for a branch of ``batch_size`` sequences: the parent's (``steps``: the
    moments remember as many steps at every batch), or raised to the power B'/B (``tokens``: the
    decay per training token, and so the memory in tokens, is the parent's at every batch)."""
    tc = parent.training
    power = batch_size / tc.batch_size if memory == "tokens" else 1.0
    return {"training.beta1": tc.beta1**power, "training.beta2": tc.beta2**power}


def branch_region(parent: RunConfig, epoch: int, tokens: int, region: int) -> int:
    """The training-stream position where a branch from virtual epoch ``epoch`` starts reading: the
    first whole shuffle group after everything the parent read by then, plus ``region`` regions of
    whole groups that hold ``tokens`` each. Each data seed of an experiment reads its own region, so
    seeds draw different sequences (the same ones at every batch size), and no branch reads a
    sequence the parent trained on before the branch point."""
    G, T = parent.data.shuffle_group_blocks, parent.data.seq_len
    read = parent.data.stream_offset + epoch * parent.steps_per_epoch * parent.training.batch_size
    return whole_groups(read, G) + region * whole_groups(tokens // T, G)


def branch_overrides(
    parent: RunConfig, state: str, epoch: int, batch_size: int, tokens: int, data: tuple[int, int], rule: str
) -> dict[str, Any]:
    """The ``section.key`` overrides that make the parent's configuration a branch from its state
    at the end of virtual epoch ``epoch`` (file ``state``): ``batch_size`` sequences per step for
    ``tokens`` training tokens, at the learning rate the parent's schedule gives its next step
    (the rate after warm-up when that step is still in it) times :func:`lr_factor`, held constant;
    ``data`` = (data seed, region: see :func:`branch_region`); root weights at each of its
    :data:`BRANCH_EPOCHS` saves (the loss curve) and final.pt."""
    tc = parent.training
    total = parent.local_steps_per_epoch * tc.epochs
    step = max(epoch * parent.local_steps_per_epoch, tc.warmup_steps)
    lr = learning_rate(min(step, total - 1), total, parent)
    steps = tokens // (batch_size * parent.data.seq_len)
    data_seed, region = data
    return {
        "training.init_from": state,
        "training.batch_size": batch_size,
        "training.micro_batch_size": min(tc.micro_batch_size, batch_size),
        "training.tokens": tokens,
        "training.epochs": math.gcd(steps, BRANCH_EPOCHS),
        "training.lr": lr * lr_factor(rule, tc.optimizer, batch_size / tc.batch_size),
        "training.lr_schedule": "constant",
        "training.warmup_steps": 0,
        "training.checkpoint_policy": "interval",
        "training.keep_states": [],
        "data.seed": data_seed,
        "data.stream_offset": branch_region(parent, epoch, tokens, region),
    }


def load_start(config: RunConfig, workers: list[Any]) -> None:
    """Load the state a branch starts from (``training.init_from``) into its one worker.

    Raises:
        ValueError: naming the file: missing, unreadable, a packed run's, or of another model or
            optimizer.
    """
    path = Path(config.training.init_from)
    if not path.exists():
        raise ValueError(
            f"training.init_from: {path} does not exist; a run keeps state-NNN.pt only at the epochs its "
            f"training.keep_states names (train the parent with them, or branch from a kept state)"
        )
    from tiny_llm.model.checkpoint import load_train_state  # torch: not for the planner

    state = load_train_state(path)
    parent = config_from_dict(state["config"])
    if len(state["workers"]) != 1 or len(workers) != 1:
        raise ValueError(f"training.init_from: {path} is a packed run's state; branches start from ordinary runs")
    if parent.model != config.model or parent.training.optimizer != config.training.optimizer:
        raise ValueError(
            f"training.init_from: {path} holds a {parent.model.architecture} model with its "
            f"{parent.training.optimizer} state; the branch's model and optimizer must be the same"
        )
    saved = state["workers"][0]
    workers[0].model.load_state_dict(saved["model"], strict=True)
    workers[0].optimizer.load_state_dict(saved["optimizer"])


def held_out_blocks(parent: RunConfig, sequences: int) -> list[int]:
    """The first ``sequences`` cache blocks of the parent's unseen stream (no branch trains on them).

    Raises:
        ValueError: more sequences than one unseen epoch holds.
    """
    blocks = [int(b) for b in unseen_plan(parent).blocks.reshape(-1)]
    if sequences > len(blocks):
        raise ValueError(
            f"eval_sequences: {sequences} held-out sequences asked for, one unseen epoch of the run holds "
            f"{len(blocks)}; ask for at most that many"
        )
    return blocks[:sequences]


def held_out_loss(weights: str | Path, config: RunConfig, blocks: list[int], device: str = "cpu") -> float:
    """The token-mean loss of a run's weights (a training state such as final.pt or state-NNN.pt,
    or root weights epoch-NNN.safetensors) on the cache blocks ``blocks``, in float64 on the CPU
    and float32 on a GPU, ``training.micro_batch_size`` sequences at a time or as many as make
    :data:`EVAL_TOKENS` tokens, whichever is more (forward only: no gradient is kept). A branch that
    diverged (weights not finite) has loss +∞; weights that do not fit the model are refused."""
    import torch  # not for the planner

    from tiny_llm.architectures import build_model
    from tiny_llm.model.causal import token_losses
    from tiny_llm.model.checkpoint import check_state_dict, load_train_state, load_weights

    dtype = torch.float64 if device == "cpu" else torch.float32
    model = build_model(config.model, attention_backend="reference")
    state = load_weights(weights)[0] if str(weights).endswith(".safetensors") else load_train_state(weights)["model"]
    if not all(bool(torch.isfinite(t).all()) for t in state.values()):
        return math.inf  # diverged: worse than any branch that trained
    check_state_dict(model, state, source=str(weights))
    model.load_state_dict(state, strict=True)
    model = model.to(device=device, dtype=dtype).eval()
    tokens = TokenCache(config.data.cache).tokens(blocks).to(device)
    total, size = 0.0, max(config.training.micro_batch_size, EVAL_TOKENS // config.data.seq_len)
    with torch.no_grad():
        for start in range(0, len(tokens), size):
            chunk = tokens[start : start + size]
            total += float(token_losses(model(chunk[:, :-1]), chunk[:, 1:]).double().sum())
    return total / (len(tokens) * (tokens.shape[1] - 1))


def measure_branches(spec: dict[str, Any]) -> dict[str, Any]:
    """The record of one checkpoint's branches (``spec``: :meth:`~tiny_llm.campaign.cbs.CbsPlan.evaluation`):
    the held-out loss of the parent's state there (``start_loss``), and of every branch at each of
    its saved points, ``curve`` = [[0, start_loss], [tokens, loss], …] up to its budget (``loss``:
    the last; null where the branch diverged)."""
    base = config_from_dict(spec["base"])

    def loss(weights: str) -> float | None:  # None: diverged (JSON has no ∞)
        value = held_out_loss(weights, base, spec["blocks"], spec["device"])
        return value if math.isfinite(value) else None

    start, budget, branches = loss(spec["state"]), spec["token_budget"], []
    for run, info in spec["branches"].items():
        points = info["points"]
        curve = [[0, start]]
        curve += [[k * budget // points, loss(f"runs/{run}/{epoch_stem(k)}.safetensors")] for k in range(1, points + 1)]
        branches.append({"run": run, **info, "loss": curve[-1][1], "curve": curve})
    record = {key: spec[key] for key in ("checkpoint", "step", "tokens", "token_budget")}
    return {**record, "start_loss": start, "eval_sequences": len(spec["blocks"]), "branches": branches}


def state_path(run_dir: str | Path, epoch: int) -> str:
    """Where a run keeps its state at the end of virtual epoch ``epoch``."""
    return str(Path(run_dir) / state_file(epoch))
