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

Exact quadratic forms (``split_quadratic_forms``) come from the forward Taylor mode instead: for
each micro-batch the jets run block by block, each block's parameters unsharded (FSDP2's
``unshard``) and its K direction shards all-gathered only while its jet runs, then freed; the
root's own parameters (embedding, final norm, head) stay unsharded for the whole pass. The
embedding's and the head's K directions are never gathered whole: the embedding's lookup takes its
rows from the ranks that hold them, and the loss runs on each rank's rows of the vocabulary for
every rank's tokens (``_loss_jet_on_shards``). No rank holds a full parameter-sized vector beyond
one block's K directions.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable

import torch
from torch import nn

from tiny_llm.curvature.engines import FINITE_DIFFERENCE
from tiny_llm.curvature.hessian import FD_SCALE, FlatParameters, Precision, check_differences, pad_sequences
from tiny_llm.curvature.spectrum import Layout
from tiny_llm.distributed import all_reduce_sum, world
from tiny_llm.model.causal import (
    IGNORE_INDEX,
    CausalLM,
    check_jet_rules,
    row_dots,
    token_losses,
    upcast,
    without_autocast,
)
from tiny_llm.model.jets import Jet, JetPass, per_direction, per_direction_dot

__all__ = ["ShardedHessian", "shard_layout", "shard_model", "shard_rows"]


def _gather_rows(shard: torch.Tensor, rows: int, ranks: int) -> torch.Tensor:
    """K directions of a parameter cut along its first axis into ``ranks`` chunks of ⌈rows / ranks⌉
    rows (Shard(0)): this rank's (K, local rows, ...) → every rank's, (K, rows, ...), contiguous.

    One all-gather per direction, each straight into its rows of the result: a rank-major gather of
    all K at once would need a second, transposed copy of the K gathered directions, the largest
    tensor of a pass at a real vocabulary. Beside the result it needs at most one chunk (a short
    shard padded) and, when the rows do not divide evenly, one parameter-sized scratch."""
    import torch.distributed as dist

    K, held, trailing = shard.size(0), shard.size(1), shard.shape[2:]
    chunk = -(-rows // ranks)
    out = shard.new_empty(K, rows, *trailing)
    padded = None if held == chunk else shard.new_zeros(chunk, *trailing)
    scratch = None if ranks * chunk == rows else shard.new_empty(ranks * chunk, *trailing)
    for k in range(K):
        mine = shard[k].contiguous()
        if padded is not None:
            padded[:held] = mine
            mine = padded
        dist.all_gather_single(out[k] if scratch is None else scratch, mine)
        if scratch is not None:
            out[k].copy_(scratch[:rows])
    return out


def _lookup_rows(shard: torch.Tensor, rows: int, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx`` (any shape, this rank's) of K directions cut as ``_gather_rows``'s, each taken
    from the rank that holds it: every rank's ids are all-gathered, each rank picks the rows it
    holds for every rank (zero elsewhere) and a reduce-scatter sums them back to their owners
    (exactly: each row has one owner). (K, *idx.shape, ...), moving ranks × the result's size instead
    of the K whole directions (an embedding's: K × vocabulary × width)."""
    import torch.distributed as dist

    rank, ranks = world()
    K, held, trailing = shard.size(0), shard.size(1), shard.shape[2:]
    every = idx.new_empty(ranks * idx.numel())
    dist.all_gather_single(every, idx.reshape(-1).contiguous())
    local = every.view(ranks, *idx.shape) - rank * -(-rows // ranks)
    mine = (local >= 0) & (local < held)
    picked = shard.new_zeros(ranks, K, *idx.shape, *trailing)
    if held:
        rows_of = shard[:, local.clamp(0, held - 1)].movedim(1, 0)  # (ranks, K, *idx.shape, ...)
        mask = mine.view(ranks, 1, *idx.shape, *([1] * len(trailing)))
        picked = torch.where(mask, rows_of, picked)
    out = shard.new_empty(K, *idx.shape, *trailing)
    dist.reduce_scatter_single(out.view(-1), picked.contiguous().view(-1))
    return out


class _ShardedJets(JetPass):
    """The jet pass of a sharded model: a block's directions are put into ``directions`` while its
    jet runs; the root's (embedding, final norm, head) are given as this rank's shards (``root``,
    which the sharded loss reads directly): a rule that asks for one whole (the final norm's) gets
    it all-gathered and holds it alone, and an embedding's lookup takes only the rows it needs from
    the ranks that hold them. Every rank runs the same rules in the same order, so the collectives
    pair up."""

    def __init__(self, root: dict[torch.Tensor, torch.Tensor], ranks: int, **kwargs):
        super().__init__({}, None, **kwargs)
        self.root, self.ranks = root, ranks
        """Each unsharded root parameter → this rank's (K, local rows, ...) shard of its directions."""

    def direction(self, parameter: torch.Tensor) -> torch.Tensor:
        if parameter in self.directions:
            return self.directions[parameter]
        return _gather_rows(self.root[parameter], parameter.shape[0], self.ranks)

    def direction_rows(self, parameter: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if parameter in self.directions:
            return super().direction_rows(parameter, idx)
        return _lookup_rows(self.root[parameter], parameter.shape[0], idx)


def _loss_jet_on_shards(model: CausalLM, h: Jet, targets: torch.Tensor, jets: _ShardedJets) -> torch.Tensor:
    """``CausalLM.loss_jet`` with the head cut by vocabulary rows, so that its K directions are never
    gathered: each rank forms the logits and their tangents of its own rows of the head (its shard of
    the head's directions, its rows of the unsharded weight) for every rank's tokens, which each rank
    broadcasts in turn, ``jets.head_tokens`` positions at a time; the softmax's maximum and
    normaliser and ⟨p, z1⟩ are all-reduced over the rows. Every term of the form is a sum over the
    vocabulary, so each rank returns its rows' share of every rank's tokens: (K,), whose sum over the
    ranks is the sum of the ranks' own forms (``split_quadratic_forms`` all-reduces it). Moves about
    ranks × (3K + 2) × tokens × width (the tokens' activations out, rU and rE back) instead of the
    head's K directions (K × vocabulary × width)."""
    rank, ranks = world()
    weight = model.head_weight  # (V, C), unsharded
    U = jets.root[weight]  # (K, rows here, C): this rank's shard of the head's directions
    K, held, C = U.size(0), U.size(1), weight.size(1)
    first_row = rank * -(-weight.size(0) // ranks)
    E = weight[first_row : first_row + held]
    N = targets.numel()
    mine = (h.z0.reshape(N, C), h.z1.reshape(K, N, C), None if h.z2 is None else h.z2.reshape(K, N, C))
    chunk = min(N, jets.head_tokens or N)
    total, gauss_newton = 0, 0
    for source in range(ranks):
        for start in range(0, N, chunk):
            rows = slice(start, start + chunk)
            h0, h1, h2, y = _broadcast_rows(
                source, rank, [*(None if x is None else x[..., rows, :] for x in mine), targets.reshape(N)[rows]]
            )
            form, curvature = _loss_rows_on_shards(h0, h1, h2, y, E, U, first_row, source, rank)
            total, gauss_newton = total + form, gauss_newton + curvature
    jets.gauss_newton = gauss_newton
    return total


def _broadcast_rows(source: int, rank: int, tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Rank ``source``'s ``tensors`` on every rank (the same shapes and dtypes on every rank)."""
    import torch.distributed as dist

    out = []
    for x in tensors:
        if x is not None:
            x = x.contiguous() if rank == source else torch.empty_like(x, memory_format=torch.contiguous_format)
            dist.broadcast(x, src=source)
        out.append(x)
    return out


def _loss_rows_on_shards(
    h0: torch.Tensor,
    h1: torch.Tensor,
    h2: torch.Tensor | None,
    targets: torch.Tensor,
    E: torch.Tensor,
    U: torch.Tensor,
    first_row: int,
    source: int,
    rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``CausalLM._loss_jet_rows`` over this rank's vocabulary rows [first_row, first_row + len(E)):
    its share of (form, Gauss–Newton part) of n target positions of rank ``source``, h0 (n, C), h1
    and h2 (K, n, C)."""
    import torch.distributed as dist

    z0 = h0 @ E.t()  # (n, rows here)
    z1 = per_direction(h0, U, out=torch.matmul(h1, E.t()))  # h1Eᵀ + h0Uₖᵀ, (K, n, rows here)
    with without_autocast(z0):
        keep = (targets != IGNORE_INDEX).reshape(-1, 1)
        z0 = upcast(z0)
        top = z0.amax(-1) if len(E) else z0.new_full(z0.shape[:1], float("-inf"))
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        p = torch.exp(z0 - top.unsqueeze(-1))
        p = p / all_reduce_sum(p.sum(-1, keepdim=True)) * keep  # the softmax over every rank's rows
        Et, Ut = E.to(p.dtype), U.transpose(1, 2).to(p.dtype)
        h1, z1 = upcast(h1), upcast(z1)
        p_z1 = all_reduce_sum(row_dots(z1, p))  # ⟨p, z1⟩ by row, (K, n)
        curvature = per_direction_dot(z1.sub_(p_z1.unsqueeze(-1).to(z1.dtype)).square_(), p)
        r = p.clone()  # p − e_y, e_y on the rank that holds row y
        here = ((targets >= first_row) & (targets < first_row + len(E)) & keep.view(-1)).nonzero().view(-1)
        r[here, targets[here] - first_row] -= 1
        # rU and rE summed over the ranks' rows before they meet h1 and h2, on the tokens' own rank:
        # p's part and e_y's cancel, and each rank's share alone would carry the rounding of the
        # larger uncancelled terms into the form
        rU = per_direction(r, Ut)
        dist.reduce(rU, dst=source)
        first = 2 * per_direction_dot(rU, h1, overwrite=True) if rank == source else torch.zeros_like(curvature)
        if h2 is not None:
            rE = r @ Et
            dist.reduce(rE, dst=source)
            if rank == source:
                first = first + per_direction_dot(upcast(h2), rE)
    return first + curvature, curvature


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
        fd_scale: relative step (default: the dtype's, as the single-process engine).
        progress: receives a line per pass.
        group_rows: at most this many sequences of a micro-batch per Taylor-mode group (None: B/K,
            as the one-process engine); memory only, as ``EpochHessian``'s.
        head_tokens: the head and loss of the Taylor mode this many target positions at a time
            (None: a group's at once); memory only.

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
        group_rows: int | None = None,
        head_tokens: int | None = None,
    ):
        self.group_rows, self.head_tokens = group_rows, head_tokens
        flat = FlatParameters(model)
        self.names, self.sizes, self.D, self._flat = flat.names, flat.sizes, flat.D, flat.flatten  # any tensors
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
        self.workspace: dict[str, torch.Tensor] = {}
        """Buffers the jets keep between micro-batches."""
        self.theta_norm = float(self.layout.norms(self._flat([self._local(p).detach() for p in self.params])[None])[0])

    @staticmethod
    def _local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    def _my_batches(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches, padded with an all-ignored one to the longest rank's count."""
        mine = batches[self.rank :: self.ranks]
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
        gradient = self._flat([self._local(p.grad) for p in self.params])
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
        for inputs, targets in self._my_batches(batches):
            gradient, batch_loss = self._batch_gradient(inputs, targets, n_targets)
            total += gradient.double()
            loss += batch_loss
        return total, float(all_reduce_sum(loss))

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
        sizes = [self._local(p).numel() for p in self.params]
        return [piece.view_as(self._local(p)) for piece, p in zip(flat.split(sizes), self.params, strict=True)]

    def _shift(self, step: torch.Tensor) -> None:
        with torch.no_grad():
            for p, piece in zip(self.params, self.pieces(step.to(self.precision.dtype)), strict=True):
                self._local(p).add_(piece)

    def _restore(self, saved: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, value in zip(self.params, saved, strict=True):
                self._local(p).copy_(value)

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        """H V for the rows of V, this rank's shards (K, d), accumulated over micro-batches in float64.

        Raises:
            ValueError: under bf16 autocast (``AMP_DIFFERENCES``), before any work.
        """
        check_differences(self.precision)
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
                    plus = self._batch_gradient(inputs, targets, self.n_targets)[0]
                    self._restore(saved)
                    self._shift(-step)
                    minus = self._batch_gradient(inputs, targets, self.n_targets)[0]
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

    def split_quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """vᵀHv and its Gauss–Newton part vᵀGv for the rows of V (this rank's shards (K, d)), exact,
        by the forward Taylor mode block by block (module docstring): (2, K) float64, the same on
        every rank.

        Raises:
            ValueError: a model without second-order rules (an adapter's), naming the layer.
        """
        check_jet_rules(self.model)
        V = V.to(device=self.precision.device, dtype=self.precision.dtype)
        K = len(V)
        pieces = V.split([self._local(p).numel() for p in self.params], dim=1)
        shards = {
            name: piece.reshape(K, *self._local(p).shape)
            for name, p, piece in zip(self.names, self.params, pieces, strict=True)
        }
        total = torch.zeros(2, K, dtype=torch.float64, device=self.precision.device)
        started = time.perf_counter()
        B = len(self.batches[0][0])  # every micro-batch's (the last is padded), so every rank's groups
        rows = min(max(1, B // K), self.group_rows or B)  # the Taylor mode's B/K, capped by the plan
        for inputs, targets in self._my_batches(self.batches):
            for start in range(0, B, rows):
                total += self._taylor_batch(shards, inputs[start : start + rows], targets[start : start + rows])
        self.passes += 1
        self.progress(
            f"sharded taylor pass over {len(self.batches)} micro-batches: {time.perf_counter() - started:.2f} s"
        )
        return all_reduce_sum(total)

    def _directions(self, module: nn.Module, prefix: str, shards: dict[str, torch.Tensor]) -> dict:
        """The K full directions of ``module``'s unsharded parameters, all-gathered from this rank's
        shards."""
        return {p: _gather_rows(shards[prefix + name], p.shape[0], self.ranks) for name, p in module.named_parameters()}

    def _taylor_batch(
        self, shards: dict[str, torch.Tensor], inputs: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """(2, K): this micro-batch's share of the forms and their Gauss–Newton parts."""
        model = self.model
        model.unshard()  # the root's own parameters
        root = {p: shards[name] for name, p in model.named_parameters() if not name.startswith("layers.")}
        jets = _ShardedJets(root, self.ranks, workspace=self.workspace, head_tokens=self.head_tokens)
        for index, layer in enumerate(model.layers):
            layer.jet = self._block_jet(layer, f"layers.{index}.", shards)
        try:
            with torch.no_grad(), self.precision.autocast():
                forms = _loss_jet_on_shards(model, model.jet(inputs, jets), targets, jets).double() / self.n_targets
        finally:
            for layer in model.layers:
                del layer.jet  # the class's rule again
            model.reshard()
        return torch.stack([forms, jets.gauss_newton.double() / self.n_targets])

    def _block_jet(self, layer: nn.Module, prefix: str, shards: dict[str, torch.Tensor]) -> Callable:
        """``layer.jet`` with the block's parameters unsharded and its directions gathered around it."""
        rule = type(layer).jet

        def jet(*args):  # (x, jets), or (x, cos, sin, jets) for rotary blocks: the pass is last
            jets: JetPass = args[-1]
            layer.unshard()
            directions = self._directions(layer, prefix, shards)
            jets.directions.update(directions)
            try:
                return rule(layer, *args)
            finally:
                for p in directions:
                    del jets.directions[p]
                layer.reshard()

        return jet

    def quadratic_forms(self, V: torch.Tensor) -> torch.Tensor:
        """vᵀHv for the rows of V (this rank's shards (K, d)), from the same differences: (K,) float64."""
        V = V.to(device=self.precision.device, dtype=torch.float64)
        return self.layout.dots(V, self.hvp(V))
