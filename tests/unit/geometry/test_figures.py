"""The cross-seed dashboard's panels: only metrics with values, one x range for all."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tiny_llm.geometry.figures import dashboard, panels, x_limits


def _comparison() -> pd.DataFrame:
    """Two imported seeds at two checkpoints: no training loss (no training log), the function
    update's pair cosine only at the second checkpoint (it needs the previous one)."""
    rows = []
    for step in (20, 40):
        for seed in (1, 2):
            subject = f"poly-seed-{seed}"
            rows.append((step, 512 * step, subject, "run", "seed", "train_loss", math.nan))
            rows.append((step, 512 * step, subject, "run", "seed", "eval_loss", 6.0 - step / 100 + seed / 50))
        rows.append((step, 512 * step, "poly-seed-1|poly-seed-2", "pair", "seed", "gradient_cosine", 0.1))
        if step == 40:
            rows.append((step, 512 * step, "poly-seed-1|poly-seed-2", "pair", "seed", "function_update_cosine", 0.7))
    frame = pd.DataFrame(rows, columns=["step", "tokens", "subject", "kind", "role", "metric", "value"])
    return frame.assign(se=math.nan, baseline=math.nan)


def test_a_metric_without_values_gets_no_panel_but_is_named():
    drawn, empty = panels(_comparison())
    assert drawn == ["eval_loss", "gradient_cosine", "function_update_cosine"]
    assert empty == ["train_loss"]


def test_every_panel_shares_the_experiments_x_range():
    low, high = x_limits(_comparison())
    assert low < 512 * 20 and high > 512 * 40  # the one-checkpoint metric is placed on the same axis
    assert low == pytest.approx(512 * 20 - 0.04 * 512 * 20) and high == pytest.approx(512 * 40 + 0.04 * 512 * 20)
    single = _comparison().query("step == 40")
    low, high = x_limits(single)
    assert low < 512 * 40 < high  # one checkpoint: a margin all the same


def test_the_dashboard_draws_from_such_a_comparison(tmp_path):
    path = tmp_path / "comparison.csv"
    _comparison().to_csv(path, index=False)
    dashboard(path, [tmp_path / "dashboard.png"], "poly")
    assert (tmp_path / "dashboard.png").stat().st_size > 0
