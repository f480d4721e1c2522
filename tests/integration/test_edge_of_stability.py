"""The adaptive edge of stability, as a slow check (``make test-slow``): a tiny model trained
full-batch with Adam at a constant rate has its preconditioned sharpness λ_max(P^{1/2}HP^{1/2}),
measured with the project's moments reader, epoch operator and Lanczos, settle at Adam's threshold
38/η, while the plain λ_max(H) keeps growing (benchmarks/edge_of_stability.py, which draws it)."""

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from edge_of_stability import tokens, train


@pytest.mark.slow
def test_the_preconditioned_sharpness_settles_at_adams_threshold():
    records = train(3e-3, 300, 25, tokens())
    late = [r for r in records if r["step"] >= 150]
    ratios = [r["preconditioned_sharpness"] / r["threshold"] for r in late]
    assert 0.85 < statistics.median(ratios) < 1.15, ratios
    assert all(0.7 < ratio < 1.5 for ratio in ratios), ratios
    assert late[-1]["sharpness"] > 20 * records[0]["sharpness"]  # the plain sharpness kept growing
