"""The B* a noise scale predicts through McCandlish's model: its closed form, its interval against
a Monte Carlo of the noise scale's uncertainty, and the range of noise scales that agree with a
measured interval."""

import math

import numpy as np
import pytest

from tiny_llm.results.predictions import Z95, agreeing_scales, noise_scale_prediction, prediction_interval

BUDGET, C = 64_000.0, 40_000.0


def _curve(b_noise):
    """The smallest batch's curve (B_0 = 1) when the ideal loss falls linearly, 3 − e / C."""
    return [(t, 3 - t / (1 + 1 / b_noise) / C) for t in (0, 16_000.0, 32_000.0, 48_000.0, BUDGET)]


def test_the_noise_scale_prediction_matches_its_closed_form():
    """With the ideal loss linear, 3 − e / c, the predicted difference from the base batch is
    (E / c)(1 + B_0 / B_n)(1 / (1 + B_base / B_n) − 1 / (1 + B / B_n)); set it to ε and solve."""
    b_noise, budget, c, epsilon, base = 8.0, 64_000.0, 40_000.0, 0.05, 4
    curve = [(t, 3 - t / (1 + 1 / b_noise) / c) for t in (0, 16_000.0, 32_000.0, 48_000.0, budget)]
    found = noise_scale_prediction(curve, 1, base, b_noise, epsilon, grid=[1, 2, 4, 8, 16])
    k = budget / c  # the smallest batch's curve already carries its own 1 + B_0 / B_n
    inverse = 1 / (1 + base / b_noise) - epsilon / k
    assert found["cbs"] == pytest.approx(b_noise * (1 / inverse - 1), rel=1e-9)
    assert found["cbs_grid"] == 4
    assert noise_scale_prediction(curve, 1, base, 1e6, epsilon, [1, 2, 4])["cbs"] > 1e4
    flat = [(t, 3 - t * 1e-7) for t in (0, 32_000.0, budget)]  # the whole budget gains less than ε
    assert noise_scale_prediction(flat, 1, base, b_noise, epsilon, [1, 2, 4]) == {"cbs": math.inf, "cbs_grid": 4}


def test_the_prediction_interval_matches_a_monte_carlo_of_the_noise_scale():
    """The noise scale drawn from its normal interval: the predictions' 2.5 and 97.5 percentiles are
    the predictions at the interval's ends (the prediction is monotone in the scale)."""
    curve, scale, se, epsilon = _curve(8.0), 8.0, 1.5, 0.05
    low, high = prediction_interval(curve, 1, 4, scale, se, epsilon)
    draws = np.random.default_rng(0).normal(scale, se, 4000).clip(0)
    predicted = [noise_scale_prediction(curve, 1, 4, b, epsilon, [4])["cbs"] for b in draws]
    assert np.percentile(predicted, 100 * (1 - 0.95) / 2) == pytest.approx(low, rel=0.02)
    assert np.percentile(predicted, 100 * (1 + 0.95) / 2) == pytest.approx(high, rel=0.02)
    assert low < noise_scale_prediction(curve, 1, 4, scale, epsilon, [4])["cbs"] < high
    assert prediction_interval(curve, 1, 4, scale, None, epsilon) == (None, None)
    assert Z95 == pytest.approx(1.96, abs=1e-3)


def test_the_noise_scales_that_agree_with_a_measured_interval():
    """The range's ends predict the measured interval's ends; a scale inside predicts inside, one
    outside predicts outside; an interval unbounded above leaves the range unbounded."""
    curve, epsilon = _curve(8.0), 0.05

    def predicted(scale):
        return noise_scale_prediction(curve, 1, 4, scale, epsilon, [4])["cbs"]

    low, high = agreeing_scales(curve, 1, 4, epsilon, 8, 32)
    assert 0 < low < high < math.inf
    assert predicted(low) == pytest.approx(8, rel=1e-6) and predicted(high) == pytest.approx(32, rel=1e-6)
    assert 8 <= predicted(math.sqrt(low * high)) < 32
    assert predicted(0.9 * low) < 8 and predicted(1.1 * high) >= 32
    assert agreeing_scales(curve, 1, 4, epsilon, 8, None)[1] == math.inf
    assert agreeing_scales(curve, 1, 4, epsilon, 4, 8)[0] == 0.0  # every scale predicts at least the base
