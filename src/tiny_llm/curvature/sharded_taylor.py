"""The jets of a model sharded over the ranks (FSDP2): what the sharded placement gives the
``taylor`` engine's batch computation (``Sharded.jet_pass``), which is the same on every placement.

For each micro-batch the jets run block by block, each block's parameters unsharded (FSDP2's
``unshard``) and its K direction shards all-gathered only while its jet runs, then freed; the
root's own parameters (embedding, final norm, head) stay unsharded for the whole pass. The
embedding's and the head's K directions are never gathered whole: the embedding's lookup takes its
rows from the ranks that hold them, and the loss runs on each rank's rows of the vocabulary for
every rank's tokens (``_loss_jet_on_shards``). No rank holds a full parameter-sized vector beyond
one block's K directions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial

import torch
import torch.distributed as dist
from torch import nn

from tiny_llm.model.causal import CausalLM, VocabularyRows, check_jet_rules, loss_jet_rows
from tiny_llm.model.jets import Jet, JetPass
from tiny_llm.shapes import shard_chunk, shard_span

__all__ = ["gather_rows", "lookup_rows", "sharded_jets"]


def gather_rows(shard: torch.Tensor, rows: int, ranks: int) -> torch.Tensor:
    """K directions of a parameter cut along its first axis into ``ranks`` chunks of ⌈rows / ranks⌉
    rows (Shard(0)): this rank's (K, local rows, ...) → every rank's, (K, rows, ...), contiguous.

    One all-gather per direction, each straight into its rows of the result: a rank-major gather of
    all K at once would need a second, transposed copy of the K gathered directions, the largest
    tensor of a pass at a real vocabulary. Beside the result it needs at most one chunk (a short
    shard padded) and, when the rows do not divide evenly, one parameter-sized scratch."""

    K, held, trailing = shard.size(0), shard.size(1), shard.shape[2:]
    chunk = shard_chunk(rows, ranks)
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


def lookup_rows(shard: torch.Tensor, rows: int, idx: torch.Tensor, rank: int, ranks: int) -> torch.Tensor:
    """Rows ``idx`` (any shape, this rank's) of K directions cut as ``_gather_rows``'s, each taken
    from the rank that holds it: every rank's ids are all-gathered, each rank picks the rows it
    holds for every rank (zero elsewhere) and a reduce-scatter sums them back to their owners
    (exactly: each row has one owner). (K, *idx.shape, ...), moving ranks × the result's size instead
    of the K whole directions (an embedding's: K × vocabulary × width)."""

    K, held, trailing = shard.size(0), shard.size(1), shard.shape[2:]
    every = idx.new_empty(ranks * idx.numel())
    dist.all_gather_single(every, idx.reshape(-1).contiguous())
    local = every.view(ranks, *idx.shape) - shard_span(rows, rank, ranks)[0]
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

    def __init__(self, root: dict[torch.Tensor, torch.Tensor], rank: int, ranks: int, **kwargs):
        super().__init__({}, None, **kwargs)
        self.root, self.rank, self.ranks = root, rank, ranks
        """Each unsharded root parameter → this rank's (K, local rows, ...) shard of its directions."""

    def direction(self, parameter: torch.Tensor) -> torch.Tensor:
        if parameter in self.directions:
            return self.directions[parameter]
        return gather_rows(self.root[parameter], parameter.shape[0], self.ranks)

    def direction_rows(self, parameter: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if parameter in self.directions:
            return super().direction_rows(parameter, idx)
        return lookup_rows(self.root[parameter], parameter.shape[0], idx, self.rank, self.ranks)


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
    rank, ranks = jets.rank, jets.ranks
    weight = model.head_weight  # (V, C), unsharded
    U = jets.root[weight]  # (K, rows here, C): this rank's shard of the head's directions
    K, held, C = U.size(0), U.size(1), weight.size(1)
    first_row = shard_span(weight.size(0), rank, ranks)[0]
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
            form, curvature = loss_jet_rows((h0, h1, h2), y, E, U, VocabularyRows(first_row, rank, ranks, source))
            total, gauss_newton = total + form, gauss_newton + curvature
    jets.gauss_newton = gauss_newton
    return total


def _broadcast_rows(source: int, rank: int, tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Rank ``source``'s ``tensors`` on every rank (the same shapes and dtypes on every rank)."""

    out = []
    for x in tensors:
        if x is not None:
            x = x.contiguous() if rank == source else torch.empty_like(x, memory_format=torch.contiguous_format)
            dist.broadcast(x, src=source)
        out.append(x)
    return out


@contextlib.contextmanager
def sharded_jets(
    model: nn.Module, pieces: list[torch.Tensor], rank: int, ranks: int, workspace: dict, head_tokens: int | None
) -> Iterator[tuple[JetPass, Callable]]:
    """The jet pass of K directions on a model sharded over ``ranks`` (module docstring), on rank ``rank``, given as
    this rank's shards (``pieces``: one (K, *local shape) per parameter, in order), and the loss
    rule on the ranks' vocabulary rows: the root's own parameters unsharded for the pass, each
    block's parameters unsharded and its directions gathered only while its jet runs. Every rank's
    share of the forms sums to the forms of every rank's micro-batch."""
    check_jet_rules(model)
    shards = {name: piece for (name, _), piece in zip(model.named_parameters(), pieces, strict=True)}
    model.unshard()  # the root's own parameters
    root = {p: shards[name] for name, p in model.named_parameters() if not name.startswith("layers.")}
    jets = _ShardedJets(root, rank, ranks, workspace=workspace, head_tokens=head_tokens)
    for index, layer in enumerate(model.layers):
        layer.jet = _block_jet(layer, f"layers.{index}.", shards, ranks)
    try:
        yield jets, partial(_loss_jet_on_shards, model)
    finally:
        for layer in model.layers:
            del layer.jet  # the class's rule again
        model.reshard()


def _directions(module: nn.Module, prefix: str, shards: dict[str, torch.Tensor], ranks: int) -> dict:
    """The K full directions of ``module``'s unsharded parameters, all-gathered from this rank's
    shards."""
    return {p: gather_rows(shards[prefix + name], p.shape[0], ranks) for name, p in module.named_parameters()}


def _block_jet(layer: nn.Module, prefix: str, shards: dict[str, torch.Tensor], ranks: int) -> Callable:
    """``layer.jet`` with the block's parameters unsharded and its directions gathered around it."""
    rule = type(layer).jet

    def jet(*args):  # (x, jets), or (x, cos, sin, jets) for rotary blocks: the pass is last
        jets: JetPass = args[-1]
        layer.unshard()
        directions = _directions(layer, prefix, shards, ranks)
        jets.directions.update(directions)
        try:
            return rule(layer, *args)
        finally:
            for p in directions:
                del jets.directions[p]
            layer.reshard()

    return jet
