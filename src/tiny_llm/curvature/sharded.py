"""The full-epoch Hessian of a model whose parameters are sharded over the ranks (FSDP2).

``shard_model`` applies ``torch.distributed.fsdp.fully_shard`` to every transformer block and then
to the whole model: each rank keeps 1/N of every parameter (its rows along the first axis), FSDP
gathers a block's parameters for its forward and backward only, and reduce-scatters the gradients
back to shards. ``ShardedHessian`` then measures curvature without any rank holding a
parameter-sized vector: directions, products and gradients are this rank's shards (``Layout``
gives their global positions), and every Hessian-vector product is a shard-local central
difference of gradients,

    Hv ≈ (∇L(θ + εv) − ∇L(θ − εv)) / 2ε,   ε = scale · max(1, ‖θ‖) / ‖v‖,

each rank moving its own shard of θ by ±εv and reading its own shard of the reduce-scattered
gradient. The step, the per-micro-batch differencing and the float64 accumulation are those of
the single-process ``finite_difference`` engine, so both give the same products to rounding.

The micro-batches of a pass are dealt round-robin over the ranks, as in the data-parallel passes;
a rank with one fewer takes a micro-batch whose targets are all ignored (zero loss, zero
gradient), since every rank must join every gather.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

from tiny_llm.curvature.engines import FINITE_DIFFERENCE
from tiny_llm.curvature.hessian import FD_SCALE, FlatParameters, Precision, pad_sequences
from tiny_llm.curvature.spectrum import Layout
from tiny_llm.distributed import world
from tiny_llm.model.causal import IGNORE_INDEX, token_losses

__all__ = ["ShardedHessian", "shard_layout", "shard_model"]


def shard_model(model: nn.Module) -> nn.Module:
    """Shard ``model`` in place over the current process group with FSDP2: each block of
    ``model.layers`` (when it has them), then the rest. Gradients are reduce-scattered as sums
    (FSDP's default divides by the number of ranks; each rank's loss here is already its share of
    the token-weighted epoch loss)."""
    from torch.distributed.fsdp import fully_shard

    for block in getattr(model, "layers", []):
        fully_shard(block)
    fully_shard(model)
    for module in model.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
    return model


def shard_layout(shapes: list[torch.Size], rank: int, ranks: int) -> Layout:
    """The global flat positions of rank ``rank``'s entries when every parameter (in ``shapes``'
    order, flattened row-major) is cut along its first axis into ``ranks`` chunks of
    ⌈rows / ranks⌉ rows, the last ones shorter or empty (FSDP2's ``Shard(0)``)."""
    indices, offset = [], 0
    for shape in shapes:
        rows = shape[0] if len(shape) else 1
        per_row = math.prod(shape[1:]) if len(shape) > 1 else 1
        chunk = -(-rows // ranks)
        first, last = min(rank * chunk, rows), min((rank + 1) * chunk, rows)
        indices.append(torch.arange(offset + first * per_row, offset + last * per_row))
        offset += rows * per_row
    return Layout(offset, torch.cat(indices))


class ShardedHessian:
    """The full-epoch token-mean Hessian at a sharded model's parameters, on shards.

    Args:
        model: a model in the analysis dtype and device, *not yet sharded*; it is sharded here
            (in place) over the current process group.
        tokens: (n, T+1) token rows of the epoch.
        batch_size: curvature micro-batch size (changes how the epoch is cut, not H).
        precision: dtype / device / AMP policy.
        fd_scale: relative step (default: the dtype's, as the single-process engine).
        progress: receives a line per pass.

    ``hvp``, ``quadratic_forms`` and ``gradient`` take and return this rank's shards (``layout``).
    """

    engine = FINITE_DIFFERENCE

    def __init__(
        self,
        model: nn.Module,
        tokens: torch.Tensor,
        *,
        batch_size: int,
        precision: Precision,
        fd_scale: float | None = None,
        progress: Callable[[str], None] | None = None,
    ):
        flat = FlatParameters(model)
        self.names, self.D, self._flat = flat.names, flat.D, flat.flatten  # flatten: any tensors, in order
        self.rank, self.ranks = world()
        self.model = shard_model(model)
        self.precision = precision
        self.layout = shard_layout(flat.shapes, self.rank, self.ranks)
        self.params = list(self.model.parameters())
        if sum(self._local(p).numel() for p in self.params) != len(self.layout.indices):
            raise RuntimeError("FSDP's shards do not follow Shard(0) row chunks; this layout cannot describe them")
        self.batches = pad_sequences(tokens.to(precision.device), batch_size)
        self.n_targets = int(tokens[:, 1:].numel())
        self.fd_scale = fd_scale if fd_scale is not None else FD_SCALE.get(precision.dtype, 3e-3)
        self.progress = progress or (lambda message: None)
        self.passes = 0
        self.theta_norm = float(self.layout.norms(self._flat([self._local(p).detach() for p in self.params])[None])[0])

    @staticmethod
    def _local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        sizes = [self._local(p).numel() for p in self.params]
        return [piece.view_as(self._local(p)) for piece, p in zip(flat.split(sizes), self.params, strict=True)]

    def _my_batches(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches, padded with an all-ignored one to the longest rank's count."""
        mine = batches[self.rank :: self.ranks]
        rounds = -(-len(batches) // self.ranks)
        if len(mine) < rounds:
            inputs, targets = batches[0]
            mine.append((inputs, torch.full_like(targets, IGNORE_INDEX)))
        return mine

    def _batch_gradient(self, inputs: torch.Tensor, targets: torch.Tensor, n_targets: int) -> torch.Tensor:
        """This rank's shard of the gradient of Σ_ranks (this micro-batch's loss sum) / n_targets."""
        self.model.zero_grad(set_to_none=True)
        loss = token_losses(self.precision.forward(self.model, inputs), targets).sum() / n_targets
        loss.backward()
        gradient = self._flat([self._local(p.grad) for p in self.params])
        self.model.zero_grad(set_to_none=True)
        return gradient

    def gradient(self, tokens: torch.Tensor | None = None, micro_batch_size: int | None = None) -> torch.Tensor:
        """This rank's shard of the token-mean gradient of ``tokens`` (n, T+1), float64; the epoch's
        by default, cut into ``micro_batch_size`` rows (default: the curvature micro-batch)."""
        if tokens is None:
            batches, n_targets = self.batches, self.n_targets
        else:
            batches = pad_sequences(tokens.to(self.precision.device), micro_batch_size or len(self.batches[0][0]))
            n_targets = int(tokens[:, 1:].numel())
        total = torch.zeros(len(self.layout.indices), dtype=torch.float64, device=self.precision.device)
        for inputs, targets in self._my_batches(batches):
            total += self._batch_gradient(inputs, targets, n_targets).double()
        return total

    def _shift(self, step: torch.Tensor) -> None:
        with torch.no_grad():
            for p, piece in zip(self.params, self._split(step.to(self.precision.dtype)), strict=True):
                self._local(p).add_(piece)

    def _restore(self, saved: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, value in zip(self.params, saved, strict=True):
                self._local(p).copy_(value)

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        """H V for the rows of V, this rank's shards (K, d), accumulated over micro-batches in float64."""
        V = V.to(device=self.precision.device, dtype=torch.float64)
        norms = self.layout.norms(V).tolist()
        out = torch.zeros_like(V)
        saved = [self._local(p).detach().clone() for p in self.params]
        scale = self.fd_scale * max(1.0, self.theta_norm)
        try:
            for row, (v, norm) in enumerate(zip(V, norms, strict=True)):
                if norm == 0:
                    continue
                started = time.perf_counter()
                eps = scale / norm
                step = (eps * v).to(self.precision.dtype)
                for inputs, targets in self._my_batches(self.batches):
                    self._shift(step)
                    plus = self._batch_gradient(inputs, targets, self.n_targets)
                    self._restore(saved)
                    self._shift(-step)
                    minus = self._batch_gradient(inputs, targets, self.n_targets)
                    self._restore(saved)
                    out[row] += ((plus - minus) / (2 * eps)).double()
                self.passes += 1
                self.progress(
                    f"sharded finite-difference pass over {len(self.batches)} micro-batches for direction "
                    f"{row + 1} of {len(V)} took {time.perf_counter() - started:.2f} s"
                )
        finally:
            self._restore(saved)
        return out

    def quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """vᵀHv for the rows of V (this rank's shards (K, d)), from the same differences: (K,) float64."""
        V = V.to(device=self.precision.device, dtype=torch.float64)
        return self.layout.dots(V, self.hvp(V))
