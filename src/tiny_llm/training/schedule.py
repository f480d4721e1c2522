"""The learning-rate schedule of a run: linear warmup, then cosine decay or a constant rate
(torch-free, so that the planner prices a branch's rate without importing the trainer)."""

from __future__ import annotations

import math

from tiny_llm.config import RunConfig

__all__ = ["learning_rate"]


def learning_rate(step: int, total_steps: int, config: RunConfig) -> float:
    """Learning rate of 0-based local step ``step``: linear warmup, then cosine to min_lr_ratio * lr."""
    tc = config.training
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    if tc.lr_schedule == "constant":
        return tc.lr
    progress = (step - tc.warmup_steps) / max(1, total_steps - tc.warmup_steps)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
