"""How a measurement holds its vectors, whole: norms, dots and block norms in float64, and the
Rademacher directions the seeded draw gives."""

import torch

from tiny_llm.curvature.gradients import rademacher
from tiny_llm.curvature.placement import Layout
from tiny_llm.curvature.vectors import Vectors


def test_whole_vectors_norms_dots_blocks_and_directions():
    sizes = [3, 4, 5]
    vectors = Vectors(Layout(12), lambda v: list(v.split(sizes)), seed=9)
    a, b = torch.randn(12, dtype=torch.float64), torch.randn(12, dtype=torch.float64)
    assert vectors.layout.indices is None
    assert vectors.norm(a) == float(a.norm()) and abs(vectors.squared_norm(a) - float(a @ a)) < 1e-13
    assert abs(vectors.dot(a, b) - float(a @ b)) < 1e-13
    blocks = [("first", [0]), ("rest", [1, 2])]
    norms = vectors.block_squared_norms(a, blocks)
    assert abs(norms[0] - float(a[:3] @ a[:3])) < 1e-14 and abs(norms[1] - float(a[3:] @ a[3:])) < 1e-13
    dots = vectors.block_dots(a, b, blocks)
    assert abs(dots[0] - float(a[:3] @ b[:3])) < 1e-14 and abs(sum(dots) - float(a @ b)) < 1e-13
    assert torch.equal(vectors.rademacher(2), rademacher(12, 9, 2))
