"""The learning-rate schedule: linear warmup, then cosine to min_lr_ratio × lr, or constant."""

import math

import pytest

from tiny_llm.training.schedule import learning_rate


def test_learning_rate_schedule(make_config):
    config = make_config(warmup_steps=2, lr=1.0, min_lr_ratio=0.1)
    assert learning_rate(0, 10, config) == 0.5 and learning_rate(1, 10, config) == 1.0
    assert learning_rate(2, 10, config) == pytest.approx(1.0)
    assert learning_rate(10, 10, config) == pytest.approx(0.1)
    assert learning_rate(6, 10, config) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    constant = make_config(warmup_steps=0, lr=0.5, lr_schedule="constant")
    assert {learning_rate(step, 10, constant) for step in range(10)} == {0.5}
