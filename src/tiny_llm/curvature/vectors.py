"""The held-vector space of a job: which entries of every parameter-sized vector this process holds
(``Layout``: all of them, or a rank's shard of an FSDP2-sharded model, whose positions come from
:class:`tiny_llm.shapes.Rows`), their reductions, dots and norms over the ranks, the seeded draws
of its own entries (Rademacher signs, Lanczos's Gaussian start: no rank draws into a D-vector), and
a measurement's vectors over it (``Vectors``, which the placement makes:
``Placement.vectors``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tiny_llm.curvature.blocks import squared_norms
from tiny_llm.data.tokens import derive_seed
from tiny_llm.distributed import all_reduce_sum

__all__ = ["RADEMACHER_CHUNK", "Layout", "Vectors", "gaussians", "rademacher", "signs"]

RADEMACHER_STREAM = 3
"""The seed stream of the Rademacher directions (``tiny_llm.data.tokens.derive_seed``)."""


@dataclass(frozen=True)
class Layout:
    """Which entries of a D-vector this process holds: all of them (``indices`` None, one process
    or data-parallel ranks that each hold everything), or this rank's shard, ``indices`` being the
    global positions of its entries in order (FSDP). Inner products of shards are all-reduced."""

    D: int
    indices: torch.Tensor | None = None

    def local(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's entries of ``full`` (..., D) (the whole of it unsharded)."""
        return full if self.indices is None else full[..., self.indices.to(full.device)]

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum per-rank partial sums over the ranks (unchanged unsharded)."""
        return partial if self.indices is None else all_reduce_sum(partial)

    def dots(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """Row-wise inner products ⟨a_i, b_i⟩ of (K, d) parts, reduced: (K,)."""
        return self.reduce((A * B).sum(-1))

    def norms(self, A: torch.Tensor) -> torch.Tensor:
        """Row-wise norms of (K, d) parts, reduced: (K,)."""
        return self.dots(A, A).sqrt()

    def norm(self, v: torch.Tensor) -> float:
        """‖v‖ of one vector: its own norm whole; the square root of the all-reduced float64 sum of
        squares of the ranks' parts when sharded."""
        if self.indices is None:
            return float(v.norm())
        return float(self.reduce(v.double().pow(2).sum())) ** 0.5


RADEMACHER_CHUNK = 1 << 22
"""Signs drawn at a time for a part of a Rademacher direction (memory only: the generator's sequence
is the same however it is cut, which a test checks)."""


def rademacher(D: int, seed: int, index: int, entries: torch.Tensor | None = None) -> torch.Tensor:
    """Direction ``index``: D independent ±1 signs (float64, CPU), independent of batching; with
    ``entries`` (ascending global positions, e.g. a shard's ``Layout.indices``) only those signs,
    the same values, so no rank holds D of them (``signs``)."""
    return signs(torch.Generator().manual_seed(derive_seed(seed, RADEMACHER_STREAM, index)), D, entries)


def signs(generator: torch.Generator, D: int, entries: torch.Tensor | None = None) -> torch.Tensor:
    """D independent ±1 signs from ``generator`` (float64, CPU); with ``entries`` (ascending global
    positions) only those, the same values, drawn ``RADEMACHER_CHUNK`` at a time."""
    if entries is None:
        return torch.randint(0, 2, (D,), generator=generator, dtype=torch.int8).double() * 2 - 1
    return _drawn(lambda n: torch.randint(0, 2, (n,), generator=generator, dtype=torch.int8), D, entries) * 2 - 1


def gaussians(generator: torch.Generator, D: int, entries: torch.Tensor | None = None) -> torch.Tensor:
    """D independent standard normal numbers from ``generator`` (float64, CPU), ``torch.randn``'s;
    with ``entries`` (ascending global positions) only those, the same values, drawn
    ``RADEMACHER_CHUNK`` at a time (a multiple of 16: CPU's ``randn`` gives the same sequence however
    it is cut so, which a test checks), so no rank holds D of them."""
    if entries is None:
        return torch.randn(D, dtype=torch.float64, generator=generator)
    return _drawn(lambda n: torch.randn(n, dtype=torch.float64, generator=generator), D, entries)


def _drawn(draw: Callable[[int], torch.Tensor], D: int, entries: torch.Tensor) -> torch.Tensor:
    """The ``entries`` of D numbers that ``draw(n)`` gives n at a time, one chunk held at a time."""
    parts, entries = [], entries.cpu()
    for start in range(0, D, RADEMACHER_CHUNK):
        drawn = draw(min(RADEMACHER_CHUNK, D - start))
        first, last = torch.searchsorted(entries, torch.tensor([start, start + len(drawn)])).tolist()
        parts.append(drawn[entries[first:last] - start])
    return torch.cat(parts).double()


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
