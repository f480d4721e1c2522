"""The measurement plan: the counts a (state, case) job runs and the planner prices."""

from tiny_llm.curvature.measurement import MeasurementPlan


def test_the_plan_counts_every_direction_pass_and_gradient():
    plain = MeasurementPlan.of(10, 4, 3)
    assert (plain.noise_samples, plain.directions, plain.passes(2), plain.passes(16)) == (4, 4 + 1 + 3, 4, 1)
    assert (plain.gradient_batches, plain.forward_batches) == (14, 0)
    assert MeasurementPlan.of(10, None, 0).noise_samples == 10 and MeasurementPlan.of(3, 8, 0).noise_samples == 3
    full = MeasurementPlan.of(10, 4, 3, consensus=2, blocks=5, step=True)
    # noise, ḡ and Δ, each once more per block; then the random and the consensus directions
    assert full.directions == (4 + 1 + 1) * 6 + 3 + 2
    assert full.forward_batches == 10 and full.passes(16) == 3
