"""Builders of tiny training setups for the tests: run configurations, exactly sized caches,
oracle runs of the tiny float64 model, and a view of the project for dry runs."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from oracles import TINY_MODEL

from tiny_llm.config import RunConfig, config_from_dict
from tiny_llm.data.corpus import BYTE_TOKENIZER, demo_corpus
from tiny_llm.data.preparation import Blocking, prepare_cache
from tiny_llm.data.tokens import blocks_for_tokens, capacity_blocks

REPO = Path(__file__).resolve().parents[1]
PROJECT = Path(os.environ.get("TINY_LLM_TEST_PROJECT", REPO))
"""The project whose config/ the configuration tests plan: this checkout, or (set by a test that
checks them against an edited configuration) another folder laid out like it."""
_OUTPUTS = {".git", ".venv", "runs", "results", "cache", "logs", ".snakemake", ".pytest_cache"}


def project_view(dest: Path) -> Path:
    """Link the project's own files (config/, and whatever corpus files its configuration names
    relative to it) into ``dest``, leaving out what a workflow writes, so that a dry run in
    ``dest`` plans the user's configuration as it stands without touching the project."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in PROJECT.iterdir():
        if entry.name not in _OUTPUTS and not (dest / entry.name).exists():
            (dest / entry.name).symlink_to(entry)
    return dest


def make_run_config(cache: Path, **training) -> RunConfig:
    """A fast training setup: byte vocab, width 8, seq_len 8, B=4 with micro-batch 3 (a remainder)."""
    base = {
        "batch_size": 4,
        "micro_batch_size": 3,
        "tokens": 4 * 8 * 3 * 2,
        "epochs": 2,
        "warmup_steps": 1,
        "checkpoint_policy": "interval",
        "log_every": 1000,
    }
    base.update(training)
    return config_from_dict(
        {
            "model": {"vocab_size": 256, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 16, "max_seq_len": 8},
            "data": {"cache": str(cache), "seq_len": 8, "shuffle_group_blocks": 4, "seed": 7},
            "training": base,
        }
    )


def make_demo_cache(path: Path, config: RunConfig, shard_blocks: int = 5) -> Path:
    """Prepare a demo cache with exactly the capacity training plus one unseen epoch need."""
    tokens = capacity_blocks(config)["unseen"] * config.data.seq_len
    blocks = blocks_for_tokens(tokens, config.data.seq_len, config.data.shuffle_group_blocks)
    return prepare_cache(
        path,
        [demo_corpus(blocks * config.data.seq_len + 1, seed=3)],
        tokenizer=BYTE_TOKENIZER,
        vocab_size=256,
        blocking=Blocking(
            seq_len=config.data.seq_len,
            shuffle_group_blocks=config.data.shuffle_group_blocks,
            data_seed=config.data.seed,
            prepare_train_tokens=tokens,
            shard_blocks=shard_blocks,
        ),
        source={"kind": "demo", "seed": 3},
    )


def make_oracle_run(path: Path, model: dict | None = None, **training) -> RunConfig:
    """A cache of random ids < 16 and a config for the 1.4k-parameter TINY_MODEL (``model``: keys
    changed): seq_len 6, B=3 with micro-batch 2 (a remainder), 3 batches per epoch, 2 epochs,
    shuffle groups of 4."""
    base = {
        "batch_size": 3,
        "micro_batch_size": 2,
        "tokens": 3 * 6 * 3 * 2,
        "epochs": 2,
        "warmup_steps": 1,
        "checkpoint_policy": "interval",
        "lr": 0.05,
        "attention_backend": "reference",
    }
    base.update(training)
    config = config_from_dict(
        {
            "model": {**TINY_MODEL.__dict__, **(model or {})},
            "training": base,
            "data": {"cache": str(path / "cache"), "seq_len": 6, "shuffle_group_blocks": 4, "seed": 3},
        }
    )
    if not (path / "cache").exists():
        ids = torch.randint(
            0, 16, (capacity_blocks(config)["unseen"] * 6 + 1,), generator=torch.Generator().manual_seed(5)
        )
        prepare_cache(
            path / "cache",
            [ids.numpy()],
            tokenizer={"type": "external", "vocab_size": 16},
            vocab_size=16,
            blocking=Blocking(
                seq_len=6,
                shuffle_group_blocks=4,
                data_seed=3,
                prepare_train_tokens=capacity_blocks(config)["unseen"] * 6,
                shard_blocks=7,
            ),
            source={"kind": "test"},
        )
    return config


def smallest_budget_gb(plan) -> float:
    """The smallest memory budget (GiB, by bisection) that ``plan(budget_gb)`` accepts without a
    ValueError: the one that puts the plan's largest pass at one sequence per group."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        try:
            plan(middle)
            high = middle
        except ValueError:
            low = middle
    return high


def small_cache(path, segments, *, seq_len=4, G=3, capacity=None, shard_blocks=4, vocab=1000, keep_order=False, seed=0):
    """A cache of ``segments`` (byte tokenizer record, vocabulary ``vocab``): blocks of ``seq_len``
    in groups of ``G``, ``capacity`` training tokens kept (None: every whole group)."""
    return prepare_cache(
        path,
        segments,
        tokenizer=BYTE_TOKENIZER,
        vocab_size=vocab,
        blocking=Blocking(
            seq_len=seq_len,
            shuffle_group_blocks=G,
            data_seed=seed,
            prepare_train_tokens=capacity,
            shard_blocks=shard_blocks,
        ),
        source={"kind": "test"},
        keep_order=keep_order,
    )
