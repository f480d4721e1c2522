"""The critical batch size three ways: Merrill's rule on hand-computed grids, the B_crit fit on
synthetic losses whose B_crit is set by construction, and the noise scale's prediction against its
closed form."""

import math

import pytest

from tiny_llm.results.critical import (
    fit_critical_batch,
    merrill_rule,
    noise_scale_prediction,
    paired_difference,
    student_t,
    tokens_to_reach,
)


def test_student_t_matches_the_tables():
    for dof, quantile in ((1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert student_t(0.95, dof) == pytest.approx(quantile, abs=1e-3)
    assert student_t(0.90, 5) == pytest.approx(2.015, abs=1e-3)


def _seeded(means, spread=None):
    """losses[B][seed]: each mean plus a per-seed shift shared by every batch (paired exactly),
    plus ``spread[B]`` × (−1, 0, 1) of its own."""
    spread = spread or {}
    return {b: {s: m + 0.001 * s + spread.get(b, 0) * (s - 2) for s in (1, 2, 3)} for b, m in means.items()}


def test_merrill_rule_on_a_monotone_grid():
    losses = _seeded({4: 3.000, 8: 3.004, 16: 3.009, 32: 3.030, 64: 3.100})
    found = merrill_rule(losses, base=4, epsilon=0.01)
    assert (found["cbs"], found["cbs_point"], found["cbs_low"], found["cbs_high"]) == (16, 16, 16, 32)
    assert found["worst"][32] == pytest.approx((0.030, 0.0), abs=1e-12)


def test_merrill_rule_compares_each_batch_with_every_smaller_one_on_a_non_monotone_grid():
    """8 is 0.02 above 4, so it is out; 16 is within 0.01 of both 4 and 8, so it is in; 32 is 0.05
    above 4. Batches below the base (2) take no part."""
    losses = _seeded({2: 2.5, 4: 3.00, 8: 3.02, 16: 3.005, 32: 3.05})
    found = merrill_rule(losses, base=4, epsilon=0.01)
    assert found["grid"] == [4, 8, 16, 32]
    assert (found["cbs"], found["cbs_point"], found["cbs_high"]) == (16, 16, 32)
    with pytest.raises(ValueError, match="does not hold the base batch 3"):
        merrill_rule(losses, base=3, epsilon=0.01)


def test_a_batch_is_within_epsilon_only_when_its_interval_is():
    """8's mean difference (0.008) is within ε = 0.01 but its interval is not: B* is the base batch
    by the interval, 8 by the means, and the data leave it anywhere below 16."""
    losses = _seeded({4: 3.0, 8: 3.008, 16: 3.2}, spread={8: 0.004})
    mean, half = paired_difference(losses[8], losses[4], 0.95)
    assert mean == pytest.approx(0.008) and half == pytest.approx(4.303 * 0.004 / math.sqrt(3), rel=1e-3)
    found = merrill_rule(losses, base=4, epsilon=0.01)
    assert (found["cbs"], found["cbs_point"], found["cbs_low"], found["cbs_high"]) == (4, 8, 4, 16)


def test_one_seed_resolves_nothing():
    losses = {4: {1: 3.0}, 8: {1: 3.001}, 16: {1: 3.5}}
    found = merrill_rule(losses, base=4, epsilon=0.01)
    assert (found["cbs"], found["cbs_point"], found["cbs_high"]) == (4, 8, None)


def test_tokens_to_reach_interpolates_the_first_crossing():
    curve = [(0, 3.0), (100, 2.0), (200, 1.5), (300, 1.6)]
    assert tokens_to_reach(curve, 2.5) == 50
    assert tokens_to_reach(curve, 1.75) == 150
    assert tokens_to_reach(curve, 3.0) == 0
    assert tokens_to_reach(curve, 1.0) is None


def _synthetic(b_crit, grid=(1, 2, 4, 8, 16, 32, 64), budget=64_000.0, noise=0.0):
    """Curves of McCandlish's model: a branch of batch B at t tokens has made the progress of an
    ideal run at t / (1 + B / B_crit); the ideal loss falls linearly, 3 − e / 40,000. Each seed adds
    ``noise`` × (seed − 2) to every loss of its curves (paired)."""

    def loss(tokens, batch):
        ideal = tokens / (1 + batch / b_crit) if b_crit < math.inf else tokens
        return 3 - ideal / 40_000

    points = [budget * q / 4 for q in range(5)]
    return {b: {s: [(t, loss(t, b) + (noise * (s - 2) if t else 0)) for t in points] for s in (1, 2, 3)} for b in grid}


def test_the_fit_recovers_b_crit_set_by_construction():
    (fit,) = fit_critical_batch(_synthetic(8.0), targets=[2.9])
    assert fit["b_crit"] == pytest.approx(8.0, rel=1e-9)
    assert fit["e_min"] == pytest.approx(4_000.0, rel=1e-9)
    assert fit["tokens"][0] == pytest.approx(4_000 * (1 + 1 / 8))
    noisy = fit_critical_batch(_synthetic(8.0, noise=0.002), targets=[2.9, 2.85])
    for fit in noisy:
        assert fit["low"] <= 8.0 <= fit["high"] and fit["low"] < fit["high"]


def test_the_fit_at_the_two_ends():
    """No noise: every step is worth the same at any batch, E grows as B, B_crit ≈ 0. All noise:
    the tokens needed do not depend on the batch, B_crit = ∞. A target not reached: no fit."""
    grid = (1, 2, 4, 8)
    steps = {b: {s: [(t, 3 - t / b / 1000) for t in (0, 2000.0, 4000.0, 6000.0, 8000.0)] for s in (1, 2)} for b in grid}
    (noiseless,) = fit_critical_batch(steps, targets=[2.5])
    assert noiseless["b_crit"] == pytest.approx(0.0, abs=1e-9)
    (flat,) = fit_critical_batch(_synthetic(math.inf, grid=grid), targets=[2.9])
    assert flat["b_crit"] == math.inf
    (missed,) = fit_critical_batch(_synthetic(8.0), targets=[0.5])
    assert missed["b_crit"] is None and missed["low"] is None and missed["batches"] == []
    (part,) = fit_critical_batch(_synthetic(8.0), targets=[2.3])  # only batches 1 … 8 get there
    assert part["batches"] == [1, 2, 4, 8] and part["b_crit"] == pytest.approx(8.0, rel=1e-9)


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
