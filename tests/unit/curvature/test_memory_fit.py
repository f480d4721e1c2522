"""The fitted coefficients: one model per engine's memory key and for a gradient pass, each with
the four phases of the memory model, each phase's features among the model's, every coefficient a
non-negative number (memory is a sum of what a pass holds)."""

from tiny_llm.curvature.engines import ENGINES, GRADIENT
from tiny_llm.curvature.memory import PHASES
from tiny_llm.curvature.memory_fit import COEFFICIENTS


def test_every_engine_has_a_fit_of_the_four_phases_with_non_negative_coefficients():
    assert set(COEFFICIENTS) == {*(e.memory for e in ENGINES.values()), GRADIENT}
    for key, phases in COEFFICIENTS.items():
        assert len(phases) == len(PHASES), key
        for phase, features in zip(phases, PHASES, strict=True):
            assert set(phase) <= set(features), key  # a feature left out weighs nothing
            assert all(a >= 0 and b >= 0 for a, b in phase.values()), key
