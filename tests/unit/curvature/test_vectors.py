"""How a job holds its vectors: whole, norms, dots and block norms in float64; the seeded draws
(noise batches, Rademacher signs, Lanczos's Gaussian start) fixed functions of the seed, a rank's
entries of each the whole draw's."""

import torch

from tiny_llm.curvature import vectors as held
from tiny_llm.curvature.gradients import noise_batch_indices
from tiny_llm.curvature.vectors import Layout, Vectors, rademacher
from tiny_llm.shapes import Rows


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


def test_the_draws_are_fixed_functions_of_the_seed_and_a_slice_is_the_whole_draws(monkeypatch):
    drawn = noise_batch_indices(10, 4, seed=3)
    assert drawn == noise_batch_indices(10, 4, seed=3) and len(set(drawn)) == 4 and max(drawn) < 10
    assert noise_batch_indices(10, 4, seed=4) != drawn
    assert sorted(noise_batch_indices(5, None, 3)) == list(range(5)) == sorted(noise_batch_indices(5, 99, 3))
    whole = rademacher(1000, 7, 2)
    assert set(whole.unique().tolist()) == {-1.0, 1.0} and torch.equal(whole, rademacher(1000, 7, 2))
    monkeypatch.setattr(held, "RADEMACHER_CHUNK", 64)  # drawn in many chunks: the same signs
    entries = torch.tensor([0, 5, 63, 64, 65, 500, 999])
    assert torch.equal(rademacher(1000, 7, 2, entries), whole[entries])


def test_a_shards_gaussian_entries_are_the_whole_draws(monkeypatch):
    """Lanczos's start on a rank: only its entries, drawn a chunk at a time, equal to torch.randn's
    whole draw at those positions (CPU's randn gives one sequence however it is cut in multiples of
    16), for every rank of an uneven split and for the whole vector."""
    assert held.RADEMACHER_CHUNK % 16 == 0
    monkeypatch.setattr(held, "RADEMACHER_CHUNK", 1024)
    D, shapes = 10_007, ((5003, 2), (1,))
    whole = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    assert torch.equal(held.gaussians(torch.Generator().manual_seed(4), D), whole)
    for rank in range(3):
        entries = Rows(shapes, rank, 3, sharded=True).indices()
        drawn = held.gaussians(torch.Generator().manual_seed(4), D, entries)
        assert torch.equal(drawn, whole[entries])
