"""The full-epoch Hessian of a model whose parameters are sharded over the ranks (FSDP2), one rank
included: the one curvature operator (``EpochHessian``) under the ``sharded`` placement
(:mod:`tiny_llm.curvature.placement`).

``shard_model`` applies ``torch.distributed.fsdp.fully_shard`` to every transformer block and then
to the whole model: each rank keeps 1/N of every parameter (its rows along the first axis), FSDP
gathers a block's parameters for its forward and backward only, and reduce-scatters the gradients
back to shards. ``ShardedHessian`` then measures curvature without any rank holding a
parameter-sized vector: directions, products and gradients are this rank's shards (``layout``
gives their global positions). Its passes are ``EpochHessian``'s: the same loop, the same
per-micro-batch engines, those that declare the ``sharded`` placement (``Engine.placements``);
another is refused by name before the model is sharded:

* ``finite_difference``: each product a shard-local central difference of gradients, each rank
  moving its own shard of θ by ±εv and reading its own shard of the reduce-scattered gradient.
* ``taylor``: the exact forms and their Gauss–Newton parts by the forward Taylor mode, block by
  block, each block's directions gathered only while it runs (``tiny_llm.curvature.sharded_taylor``).

The micro-batches of a pass are dealt round-robin over the ranks, as in the data-parallel passes;
a rank with one fewer takes a micro-batch whose targets are all ignored (zero loss, zero gradient),
since every rank must join every gather.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tiny_llm.curvature.engines import FINITE_DIFFERENCE
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.gradients import mean_gradient
from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.curvature.placement import place, shard_layout, shard_model, shard_rows

__all__ = ["ShardedHessian", "shard_layout", "shard_model", "shard_rows"]


class ShardedHessian(EpochHessian):
    """The full-epoch token-mean Hessian at a sharded model's parameters, on shards.

    Args:
        model: a model in the analysis dtype and device, *not yet sharded*; it is sharded here
            (in place) over the current process group.
        tokens: (n, T+1) token rows of the epoch.
        batch_size: curvature micro-batch size (changes how the epoch is cut, not H).
        precision: dtype / device / AMP policy.
        engine: an engine of the registry that runs sharded (``Engine.placements``); another is
            refused by name.
        options: ``EpochHessian``'s other keywords (``progress``, ``group_rows``,
            ``head_tokens``, ``directions_per_pass``).

    ``hvp``, ``quadratic_forms`` and ``gradient`` take and return this rank's shards (``layout``).

    Raises:
        ValueError: an engine that does not run sharded, naming those that do.
    """

    def __init__(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        *,
        batch_size: int,
        precision: Precision,
        engine: str = FINITE_DIFFERENCE,
        **options,
    ):
        engine_named(engine).check_placement("sharded")  # refused by name before the model is sharded
        placement = place(model, sharded=True)
        super().__init__(
            model, tokens, batch_size=batch_size, engine=engine, precision=precision, placement=placement, **options
        )
        self.tokens = tokens
        self.layout, self.names, self.sizes, self.D = placement.layout, self.flat.names, self.flat.sizes, self.flat.D

    def gradient(self, tokens: torch.Tensor | None = None, micro_batch_size: int | None = None) -> torch.Tensor:
        """This rank's shard of the token-mean gradient of ``tokens`` (n, T+1), float64 (the epoch's
        by default), cut into ``micro_batch_size`` rows (default: the curvature micro-batch): the
        one gradient (``gradients.mean_gradient``) on this placement."""
        rows, batch = micro_batch_size or len(self.batches[0][0]), self.tokens if tokens is None else tokens
        return mean_gradient(self.model, self.placement, [batch], rows, self.precision)

    @property
    def pieces(self) -> Callable[[torch.Tensor], list[torch.Tensor]]:
        """This rank's part of a vector (its shard, (d,)) as views, one per parameter (in order)."""
        return self.placement.pieces

    @property
    def params(self) -> list[torch.Tensor]:
        """This rank's parts of the parameters, in order."""
        return self.placement.parameters
