"""Directions restricted to parameter blocks: each part is the vector on its block and zero
elsewhere, and the parts sum to the vector."""

import torch

from tiny_llm.curvature.directions import block_parts


def test_block_parts_cut_a_vector_into_disjoint_blocks():
    v = torch.arange(1.0, 10.0, dtype=torch.float64)
    sizes = [2, 3, 4]
    blocks = [("a", [0, 2]), ("b", [1])]
    parts = list(block_parts(v, lambda x: list(x.split(sizes)), blocks))
    assert torch.equal(parts[0], torch.tensor([1.0, 2, 0, 0, 0, 6, 7, 8, 9], dtype=torch.float64))
    assert torch.equal(parts[1], torch.tensor([0.0, 0, 3, 4, 5, 0, 0, 0, 0], dtype=torch.float64))
    assert torch.equal(parts[0] + parts[1], v)
