"""The full-epoch Hessian of a model whose parameters are sharded over the ranks (FSDP2), one rank
included.

``shard_model`` applies ``torch.distributed.fsdp.fully_shard`` to every transformer block and then
to the whole model: each rank keeps 1/N of every parameter (its rows along the first axis), FSDP
gathers a block's parameters for its forward and backward only, and reduce-scatters the gradients
back to shards. ``ShardedHessian`` then measures curvature without any rank holding a
parameter-sized vector: directions, products and gradients are this rank's shards (``Layout``
gives their global positions). It runs the engine it is given by that engine's registry entry
(``Engine.sharded``) and refuses one without it by name:

* ``finite_difference`` (``difference_products``, here): each product a shard-local central
  difference of gradients, Hv ≈ (∇L(θ + εv) − ∇L(θ − εv)) / 2ε with ε = scale · max(1, ‖θ‖) / ‖v‖,
  each rank moving its own shard of θ by ±εv and reading its own shard of the reduce-scattered
  gradient. The rule is the whole-model engine's (``products.central_differences``), so both give
  the same products to rounding.
* ``taylor`` (``tiny_llm.curvature.sharded_taylor``): the exact forms and their Gauss–Newton parts
  by the forward Taylor mode, block by block, each block's directions gathered only while it runs.

The micro-batches of a pass are dealt round-robin over the ranks, as in the data-parallel passes
(``distributed.shard``); a rank with one fewer takes a micro-batch whose targets are all ignored
(zero loss, zero gradient), since every rank must join every gather.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable

import torch
from torch import nn

from tiny_llm.curvature.engines import FINITE_DIFFERENCE
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.hessian import FD_SCALE, FlatParameters, Precision, check_differences, pad_sequences
from tiny_llm.curvature.products import central_differences
from tiny_llm.curvature.spectrum import Layout
from tiny_llm.distributed import all_reduce_sum, shard, world
from tiny_llm.model.causal import (
    IGNORE_INDEX,
    token_losses,
)

__all__ = [
    "ShardedHessian",
    "difference_products",
    "shard_layout",
    "shard_model",
    "shard_rows",
]


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


def shard_rows(tensors: list[torch.Tensor], rank: int, ranks: int) -> torch.Tensor:
    """Rank ``rank``'s shard (its entries in ``shard_layout``'s order) of a parameter-sized vector
    given whole, one tensor per parameter in order (e.g. a checkpoint's): each tensor's rows of this
    rank, flattened and concatenated; nothing else is copied."""
    parts = []
    for tensor in tensors:
        rows = tensor.reshape(-1, *tensor.shape[1:]) if tensor.dim() else tensor.reshape(1)
        chunk = -(-len(rows) // ranks)
        parts.append(rows[rank * chunk : (rank + 1) * chunk].reshape(-1))
    return torch.cat(parts)


class ShardedHessian:
    """The full-epoch token-mean Hessian at a sharded model's parameters, on shards.

    Args:
        model: a model in the analysis dtype and device, *not yet sharded*; it is sharded here
            (in place) over the current process group.
        tokens: (n, T+1) token rows of the epoch.
        batch_size: curvature micro-batch size (changes how the epoch is cut, not H).
        precision: dtype / device / AMP policy.
        engine: an engine of the registry that runs sharded (``Engine.sharded``: its computation
            here); another is refused by name.
        fd_scale: relative step (default: the dtype's, as the single-process engine).
        progress: receives a line per pass.
        group_rows: at most this many sequences of a micro-batch per Taylor-mode group (None: B/K,
            as the one-process engine); memory only, as ``EpochHessian``'s.
        head_tokens: the head and loss of the Taylor mode this many target positions at a time
            (None: a group's at once); memory only.

    ``hvp``, ``quadratic_forms`` and ``gradient`` take and return this rank's shards (``layout``).
    The same interface as ``EpochHessian``'s: a forms engine gives ``split_quadratic_forms``, a
    products engine ``hvp``, both ``quadratic_forms``.

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
        fd_scale: float | None = None,
        progress: Callable[[str], None] | None = None,
        group_rows: int | None = None,
        head_tokens: int | None = None,
    ):
        self.engine, self.spec = engine, engine_named(engine)
        self._compute = self.spec.compute_sharded()  # refused by name before the model is sharded
        self.group_rows, self.head_tokens = group_rows, head_tokens
        flat = FlatParameters(model)
        self.names, self.sizes, self.D, self._flat = flat.names, flat.sizes, flat.D, flat.flatten  # any tensors
        self.rank, self.ranks = world()
        self.model = shard_model(model)
        self.precision = precision
        self.layout = shard_layout(flat.shapes, self.rank, self.ranks)
        self.params = list(self.model.parameters())
        if sum(self.local(p).numel() for p in self.params) != len(self.layout.indices):
            raise RuntimeError("FSDP's shards do not follow Shard(0) row chunks; this layout cannot describe them")
        self.batches = pad_sequences(tokens.to(precision.device), batch_size)
        self.n_targets = int(tokens[:, 1:].numel())
        self.fd_scale = fd_scale if fd_scale is not None else FD_SCALE.get(precision.dtype, 3e-3)
        self.progress = progress or (lambda message: None)
        self.passes = 0
        self.workspace: dict[str, torch.Tensor] = {}
        """Buffers the jets keep between micro-batches."""
        self.theta_norm = float(self.layout.norms(self._flat([self.local(p).detach() for p in self.params])[None])[0])

    @staticmethod
    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    def rank_batches(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches (dealt as every data-parallel pass deals them,
        ``distributed.shard``), padded with an all-ignored one to the longest rank's count."""
        mine = shard(batches)
        rounds = -(-len(batches) // self.ranks)
        if len(mine) < rounds:
            inputs, targets = batches[0]
            mine.append((inputs, torch.full_like(targets, IGNORE_INDEX)))
        return mine

    def _batch_gradient(
        self, inputs: torch.Tensor, targets: torch.Tensor, n_targets: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's shard of the gradient of Σ_ranks (this micro-batch's loss sum) / n_targets, and
        this micro-batch's share of that loss (float64, this rank's only)."""
        self.model.zero_grad(set_to_none=True)
        loss = token_losses(self.precision.forward(self.model, inputs), targets).sum() / n_targets
        loss.backward()
        gradient = self._flat([self.local(p.grad) for p in self.params])
        self.model.zero_grad(set_to_none=True)
        return gradient, loss.detach().double()

    def gradient(self, tokens: torch.Tensor | None = None, micro_batch_size: int | None = None) -> torch.Tensor:
        """This rank's shard of the token-mean gradient of ``tokens`` (n, T+1), float64; the epoch's
        by default, cut into ``micro_batch_size`` rows (default: the curvature micro-batch)."""
        return self.gradient_and_loss(tokens, micro_batch_size)[0]

    def gradient_and_loss(
        self, tokens: torch.Tensor | None = None, micro_batch_size: int | None = None
    ) -> tuple[torch.Tensor, float]:
        """``gradient``'s shard and the token-mean loss of the same tokens (float64, the same on every
        rank)."""
        if tokens is None:
            batches, n_targets = self.batches, self.n_targets
        else:
            batches = pad_sequences(tokens.to(self.precision.device), micro_batch_size or len(self.batches[0][0]))
            n_targets = int(tokens[:, 1:].numel())
        total = torch.zeros(len(self.layout.indices), dtype=torch.float64, device=self.precision.device)
        loss = torch.zeros((), dtype=torch.float64, device=self.precision.device)
        for inputs, targets in self.rank_batches(batches):
            gradient, batch_loss = self._batch_gradient(inputs, targets, n_targets)
            total += gradient.double()
            loss += batch_loss
        return total, float(all_reduce_sum(loss))

    def loss(self, tokens: torch.Tensor, micro_batch_size: int) -> float:
        """The token-mean loss of ``tokens`` (n, T+1) from forward passes only, cut and summed as
        :meth:`gradient_and_loss` does (float64, the same on every rank): what the loss at a
        shifted θ costs."""
        batches = pad_sequences(tokens.to(self.precision.device), micro_batch_size)
        n_targets = int(tokens[:, 1:].numel())
        loss = torch.zeros((), dtype=torch.float64, device=self.precision.device)
        with torch.no_grad():
            for inputs, targets in self.rank_batches(batches):
                logits = self.precision.forward(self.model, inputs)
                loss += (token_losses(logits, targets).sum() / n_targets).double()
        self.model.reshard()  # without a backward, the root's unsharded parameters are freed here
        return float(all_reduce_sum(loss))

    def on(self, tokens: torch.Tensor) -> ShardedHessian:
        """The same operator (the same sharded model, layout and step) over other token rows (n, T+1):
        the Hessian of their token-mean loss (the precision audit's micro-batches)."""
        other = copy.copy(self)
        other.batches = pad_sequences(tokens.to(self.precision.device), len(self.batches[0][0]))
        other.n_targets = int(tokens[:, 1:].numel())
        other.workspace, other.passes = {}, 0
        return other

    def pieces(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """This rank's part of a vector (its shard, (d,)) as views, one per parameter (in order)."""
        sizes = [self.local(p).numel() for p in self.params]
        return [piece.view_as(self.local(p)) for piece, p in zip(flat.split(sizes), self.params, strict=True)]

    def _shift(self, step: torch.Tensor) -> None:
        with torch.no_grad():
            for p, piece in zip(self.params, self.pieces(step.to(self.precision.dtype)), strict=True):
                self.local(p).add_(piece)

    def _restore(self, saved: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, value in zip(self.params, saved, strict=True):
                self.local(p).copy_(value)

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        """H V for the rows of V, this rank's shards (K, d), accumulated over micro-batches in float64
        (a products engine).

        Raises:
            ValueError: a forms engine (it computes vᵀHv only), or finite differences under bf16
                autocast (``AMP_DIFFERENCES``), before any work.
        """
        if not self.spec.products:
            raise ValueError(
                f"the {self.engine} engine computes quadratic forms vᵀHv only, not Hessian-vector products"
            )
        return self._compute(self, V)

    def split_quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """vᵀHv and its Gauss–Newton part vᵀGv for the rows of V (this rank's shards (K, d)), exact
        (a forms engine): (2, K) float64, the same on every rank.

        Raises:
            ValueError: a products engine (no Gauss–Newton split), or a model without second-order
                rules (an adapter's), naming the layer.
        """
        if not self.spec.forms:
            raise ValueError(f"the Gauss–Newton split needs a quadratic-form engine, not {self.engine}")
        return self._compute(self, V)

    def quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """vᵀHv for the rows of V (this rank's shards (K, d)): (K,) float64, the same on every rank."""
        if self.spec.forms:
            return self.split_quadratic_forms(V)[0]
        V = V.to(device=self.precision.device, dtype=torch.float64)
        return self.layout.dots(V, self.hvp(V))

    def _shifted_gradient(
        self, saved: list[torch.Tensor], inputs: torch.Tensor, targets: torch.Tensor
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """``step -> this rank's shard of the micro-batch's gradient at θ + step`` (θ restored after)."""

        def gradient_at(step: torch.Tensor) -> torch.Tensor:
            self._shift(step)
            try:
                return self._batch_gradient(inputs, targets, self.n_targets)[0]
            finally:
                self._restore(saved)

        return gradient_at


def difference_products(operator: ShardedHessian, V: torch.Tensor) -> torch.Tensor:
    """``finite_difference`` on a sharded model: H V for this rank's shards V (K, d), each rank moving
    its own shard of θ by ±εv (``central_differences``, the rule of the whole-model engine, with the
    whole vectors' norms) and reading its shard of the reduce-scattered gradient, per micro-batch,
    accumulated in float64.

    Raises:
        ValueError: under bf16 autocast (``AMP_DIFFERENCES``), before any work.
    """
    check_differences(operator.precision, operator.model, operator.batches[0][0][:1])
    V = V.to(device=operator.precision.device, dtype=torch.float64)
    norms = operator.layout.norms(V).tolist()
    out = torch.zeros_like(V)
    saved = [operator.local(p).detach().clone() for p in operator.params]
    scale = operator.fd_scale * max(1.0, operator.theta_norm)
    started = time.perf_counter()
    for inputs, targets in operator.rank_batches(operator.batches):
        out += central_differences(operator._shifted_gradient(saved, inputs, targets), V, norms, scale).double()
    operator.passes += 1
    operator.progress(
        f"sharded finite-difference pass over {len(operator.batches)} micro-batches for {len(V)} directions "
        f"took {time.perf_counter() - started:.2f} s"
    )
    return out
