"""The critical batch size from branches: Merrill's rule on hand-computed grids and its joint
coverage by simulation, the seeds ε needs, the best rate of a grid, and the B_crit fit on synthetic
losses whose B_crit is set by construction, with censored batches and a monotonicity violation."""

import math

import numpy as np
import pytest

from tiny_llm.results.critical import (
    best_rates,
    fit_critical_batch,
    merrill_level,
    merrill_rule,
    one_sided_t,
    paired_difference,
    seeds_needed,
    student_t,
    tokens_to_reach,
)


def test_student_t_matches_the_tables():
    for dof, quantile in ((1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert student_t(0.95, dof) == pytest.approx(quantile, abs=1e-3)
    assert student_t(0.90, 5) == pytest.approx(2.015, abs=1e-3)
    assert one_sided_t(0.975, 6) == pytest.approx(2.447, abs=1e-3)
    assert one_sided_t(0.995, 6) == pytest.approx(3.707, abs=1e-3)


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
    mean, half = paired_difference(losses[8], losses[4], 0.975)
    assert mean == pytest.approx(0.008) and half == pytest.approx(4.303 * 0.004 / math.sqrt(3), rel=1e-3)
    found = merrill_rule(losses, base=4, epsilon=0.01)
    assert (found["cbs"], found["cbs_point"], found["cbs_low"], found["cbs_high"]) == (4, 8, 4, 16)
    # three batches, three comparisons, six one-sided bounds sharing 5 %: each at 1 − 0.05 / 6
    assert (found["comparisons"], found["level"], found["joint"]) == (3, pytest.approx(1 - 0.05 / 6), 0.95)
    assert found["worst"][8][1] == pytest.approx(one_sided_t(1 - 0.05 / 6, 2) * 0.004 / math.sqrt(3), rel=1e-6)
    assert found["spread"] > 0


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
    assert missed["b_crit"] is None and missed["low"] is None and missed["censored"] == missed["batches"]
    (part,) = fit_critical_batch(_synthetic(8.0), targets=[2.3])  # only batches 1 … 8 get there
    assert part["censored"] == [16, 32, 64] and part["b_crit"] == pytest.approx(8.0, rel=1e-9)


def test_merrills_interval_covers_the_true_b_star_jointly_at_95_percent():
    """Simulated seeds around true means whose B* is the base batch, every larger batch just beyond ε
    of it (ε = 0.01): the interval [cbs_low, cbs_high) holds it in at least 95 % of the
    experiments; each comparison at the two-sided 95 % level alone (the old rule) in fewer."""
    truth, sd, seeds, epsilon = {4: 0.0, 8: 0.0101, 16: 0.0101, 32: 0.0101, 64: 0.0101}, 0.006, 5, 0.01
    rng = np.random.default_rng(1)
    covered = {0.95: 0, None: 0}
    trials = 2000
    for _ in range(trials):
        shared = rng.normal(0, 0.05, seeds)  # a seed's data, common to every batch (paired)
        losses = {b: {s: 3 + m + shared[s] + rng.normal(0, sd) for s in range(seeds)} for b, m in truth.items()}
        for joint in covered:
            found = merrill_rule(losses, 4, epsilon) if joint else _uncorrected(losses, 4, epsilon)
            covered[joint] += found["cbs_low"] <= 4 < (found["cbs_high"] or math.inf)
    assert covered[0.95] / trials >= 0.95
    assert covered[None] / trials < 0.95


def _uncorrected(losses, base, epsilon):
    """The rule with every bound at 97.5 % one-sided, as before (two-sided 95 % per comparison)."""
    from tiny_llm.results import critical

    original = critical.merrill_level
    critical.merrill_level = lambda batches, joint=0.95: (batches * (batches - 1) // 2, 0.975)
    try:
        return critical.merrill_rule(losses, base, epsilon)
    finally:
        critical.merrill_level = original


def test_the_seeds_that_epsilon_needs():
    """The fewest seeds whose bounds are within ε / 2 at the given spread, and no fewer."""
    spread, epsilon = 0.01, 0.01
    n = seeds_needed(spread, epsilon, batches=5)
    _, level = merrill_level(5)
    assert one_sided_t(level, n - 1) * spread / math.sqrt(n) <= epsilon / 2
    assert one_sided_t(level, n - 2) * spread / math.sqrt(n - 1) > epsilon / 2
    assert seeds_needed(spread / 2, epsilon, 5) < n < seeds_needed(spread, epsilon / 2, 5)
    assert seeds_needed(10.0, 1e-4, 5) is None


def test_the_best_rate_of_a_grid_is_flagged_at_its_edge():
    losses = {
        2: {0.5: {1: 3.0, 2: 3.1}, 1.0: {1: 3.1, 2: 3.2}, 2.0: {1: 3.3, 2: 3.4}},  # best at the edge
        4: {0.5: {1: 3.2, 2: 3.2}, 1.0: {1: 3.0, 2: 3.1}, 2.0: {1: 3.1, 2: 3.1}},
        8: {1.0: {1: 3.0, 2: 3.0}},  # one rate: nothing to tune
    }
    assert best_rates(losses) == {2: (0.5, True), 4: (1.0, False), 8: (1.0, False)}


def test_a_batch_that_misses_the_target_is_censored_not_dropped():
    """Batches 1, 2, 4 need 1,000 tokens each; 8 and 16 do not reach the target within 2,000.
    Dropping them would fit a flat line (B_crit = ∞); as censored observations (E > 2,000) they
    pull the line up toward the budget there, and B_crit is finite. The fit minimises the censored
    objective: no nearby line does better."""
    budget, points = 2000.0, (0.0, 500.0, 1000.0, 1500.0, 2000.0)

    def curve(batch):
        if batch <= 4:
            return [(t, 3 - t / 1000) for t in points]
        return [(t, 3 - t / 4000) for t in points]  # reaches 2.5 only at 2,000 … never 2.0

    curves = {b: {s: curve(b) for s in (1, 2)} for b in (1, 2, 4, 8, 16)}
    (fit,) = fit_critical_batch(curves, targets=[2.0])
    assert fit["censored"] == [8, 16] and fit["tokens"][3:] == [None, None]
    assert math.isfinite(fit["b_crit"])
    e_min, slope = fit["e_min"], fit["e_min"] / fit["b_crit"]
    assert e_min + 8 * slope > 1.3 * 1000

    def objective(e, s):
        seen = sum(((1000 - e - s * b) / 1000) ** 2 for b in (1, 2, 4))
        return seen + sum((max(0.0, budget - e - s * b) / budget) ** 2 for b in (8, 16))

    best = objective(e_min, slope)
    for de, ds in ((1, 0), (-1, 0), (0, 0.1), (0, -0.1), (1, -0.1), (-1, 0.1)):
        assert best <= objective(e_min + 10 * de, slope + 10 * ds)


def test_tokens_that_fall_with_the_batch_are_flagged():
    """Batch 2 needs more tokens than 4 and 8 in every seed: outside McCandlish's model, flagged;
    curves of the model itself, with seed noise, are not."""
    points = (0.0, 1000.0, 2000.0, 3000.0, 4000.0)
    speed = {2: 1 / 2000, 4: 1 / 1000, 8: 1 / 1100, 16: 1 / 1600}
    curves = {b: {s: [(t, 3 - t * v * (1 + 0.01 * s)) for t in points] for s in (1, 2, 3)} for b, v in speed.items()}
    (fit,) = fit_critical_batch(curves, targets=[1.5])
    assert (2, 4) in fit["violations"] and (2, 8) in fit["violations"] and (4, 16) not in fit["violations"]
    for fit in fit_critical_batch(_synthetic(8.0, noise=0.002), targets=[2.9, 2.85]):
        assert fit["violations"] == []
