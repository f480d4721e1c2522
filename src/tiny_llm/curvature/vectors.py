"""How a measurement holds its parameter-sized vectors: whole, or as this rank's shard of an
FSDP2-sharded model (norms then local sums all-reduced), with the Rademacher directions one
process draws."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tiny_llm.curvature.blocks import squared_norms
from tiny_llm.curvature.gradients import rademacher
from tiny_llm.curvature.placement import Layout

__all__ = ["Vectors"]


class Vectors:
    """How a measurement holds its parameter-sized vectors: whole (one process, or data-parallel
    ranks that each hold all of every vector; ``layout`` without indices) or as this rank's shard of
    an FSDP2-sharded model (``layout.indices``), whose norms are local sums all-reduced.
    ``pieces`` cuts a vector into its per-parameter views (in the flat vector's order)."""

    def __init__(self, layout: Layout, pieces: Callable[[torch.Tensor], list[torch.Tensor]], seed: int):
        self.layout, self.pieces, self.seed = layout, pieces, seed

    def squared_norm(self, v: torch.Tensor) -> float:
        return float(self.layout.reduce(v.double().pow(2).sum()))

    def norm(self, v: torch.Tensor) -> float:
        return self.layout.norm(v)

    def dot(self, a: torch.Tensor, b: torch.Tensor) -> float:
        """aᵀb in float64 (local sums all-reduced when sharded)."""
        return float(self.layout.reduce((a.double() * b.double()).sum()))

    def block_dots(self, a: torch.Tensor, b: torch.Tensor, blocks: list[tuple[str, list[int]]]) -> list[float]:
        """Each block's a_bᵀb_b in float64 (all-reduced when sharded)."""
        per = [float((x.double() * y.double()).sum()) for x, y in zip(self.pieces(a), self.pieces(b), strict=True)]
        return self._reduced([sum(per[i] for i in indices) for _, indices in blocks], a.device)

    def block_squared_norms(self, v: torch.Tensor, blocks: list[tuple[str, list[int]]]) -> list[float]:
        return self._reduced(squared_norms(self.pieces(v), blocks), v.device)

    def _reduced(self, local: list[float], device: torch.device) -> list[float]:
        """Per-rank partial sums summed over the ranks (float64 both ways: unchanged unsharded)."""
        return self.layout.reduce(torch.tensor(local, dtype=torch.float64, device=device)).tolist()

    def rademacher(self, index: int) -> torch.Tensor:
        """Rademacher direction ``index``: the signs one process draws, this rank's of them when sharded."""
        return rademacher(self.layout.D, self.seed, index, self.layout.indices)
