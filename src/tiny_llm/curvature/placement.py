"""Where a job's model and its parameter-sized vectors live: one object per job, asked by the one
curvature operator (:class:`tiny_llm.curvature.hessian.EpochHessian`) and nothing else.

* ``whole``: one process holds the model and every vector.
* ``data_parallel``: every rank holds the whole model and every vector; the epoch's micro-batches
  are dealt round-robin over the ranks and each pass's sums are all-reduced.
* ``sharded``: the model is sharded over the ranks with FSDP2 (``shard_model``): each rank holds its
  rows of every parameter (``Shard(0)``) and of every vector (``layout``); the micro-batches are
  dealt as data-parallel ones, a rank with one fewer taking one whose targets are all ignored (every
  rank must join every gather); gradients are reduce-scattered, so a rank's share of a product is
  already whole for its rows.

What differs between the three is here: the layout of a rank's entries, the dealing, the reductions,
the parameters a rank moves to shift θ (and restores), the per-parameter views of a vector, the
norms of vectors, and the directions the jet rules read (``jet_pass``). An engine never asks which
placement it runs under; it declares the placements it supports (``Engine.placements``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator

import torch
from torch import nn

from tiny_llm.curvature.sharding import SHARDED_GRADIENT_HEAD_CHUNKS
from tiny_llm.curvature.vectors import Layout, Vectors
from tiny_llm.distributed import all_reduce_sum, world
from tiny_llm.distributed import sharded as runs_sharded
from tiny_llm.model.causal import IGNORE_INDEX
from tiny_llm.model.jets import JetPass
from tiny_llm.shapes import Rows

__all__ = [
    "PLACEMENTS",
    "Placement",
    "Sharded",
    "held_shards",
    "hold",
    "job_rows",
    "place",
    "shard_layout",
    "shard_model",
    "shard_rows",
]

PLACEMENTS = ("whole", "data_parallel", "sharded")
"""The placements an engine may declare (``Engine.placements``)."""

Batches = list[tuple[torch.Tensor, torch.Tensor]]


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
    """The layout of rank ``rank``'s entries when every parameter of ``shapes`` is cut into ``ranks``
    row chunks (:class:`tiny_llm.shapes.Rows`)."""
    rows = Rows(tuple(shapes), rank, ranks, sharded=True)
    return Layout(rows.D, rows.indices())


def shard_rows(tensors: list[torch.Tensor], rank: int, ranks: int) -> torch.Tensor:
    """Rank ``rank``'s shard (its entries in ``shard_layout``'s order) of a parameter-sized vector
    given whole, one tensor per parameter in order (:meth:`tiny_llm.shapes.Rows.cut`)."""
    return Rows(tuple(t.shape for t in tensors), rank, ranks, sharded=True).cut(tensors)


def job_rows(shapes: list[torch.Size], asked: bool) -> Rows:
    """The rows of parameters of ``shapes`` this process holds in a job that ``asked`` for a sharded
    model: its rank's of the process group's when the job runs sharded (asked, and in a process
    group), else every row (one process, or data-parallel ranks that each hold everything). The one
    place that answers "is it sharded": the placement and the workers' vectors ask it."""
    rank, ranks = world()
    shapes = tuple(tuple(s) for s in shapes)
    return Rows(shapes, rank, ranks, sharded=True) if runs_sharded(asked) else Rows(shapes)


def held_shards(asked: bool) -> int:
    """The ranks a job that ``asked`` for a sharded model cuts its vectors over: the process group's
    when it runs sharded (``job_rows``), else 1 (its memory plan is then one process's)."""
    return world()[1] if runs_sharded(asked) else 1


def hold(model: nn.Module, asked: bool, device: torch.device, dtype: torch.dtype) -> Rows:
    """The rows this process holds of ``model``'s parameters in a job that ``asked`` for a sharded
    model (``job_rows``), with the model cast to ``dtype``: moved to ``device`` unless it runs
    sharded (FSDP moves each block's shards to the device when it shards it, ``place``)."""
    rows = job_rows([p.shape for p in model.parameters()], asked)
    model.to(dtype=dtype, **({} if rows.sharded else {"device": device}))
    return rows


class Placement:
    """One process, or data-parallel ranks that each hold the whole model (module docstring)."""

    sharded = False
    """Whether each rank holds only its rows of the parameters and vectors."""
    head_chunks = True
    """Whether a gradient may take the head and loss in token chunks (through ``model.hidden``)."""

    def __init__(self, model: nn.Module, layout: Layout, rank: int = 0, ranks: int = 1):
        self.model, self.layout, self.rank, self.ranks = model, layout, rank, ranks
        self.parameters = [self.local(p) for p in model.parameters()]
        """What this rank holds of each parameter, in the flat vector's order (tied weights once)."""
        self.sizes = [p.numel() for p in self.parameters]

    @property
    def spreads(self) -> bool:
        """Whether ``split`` spreads units of gradient work over several ranks (data-parallel)."""
        return self.ranks > 1

    @property
    def name(self) -> str:
        """Its name in ``PLACEMENTS``."""
        return "data_parallel" if self.ranks > 1 else "whole"

    @staticmethod
    def local(tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of a parameter or its gradient (the tensor itself, unsharded)."""
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """This rank's parts of per-parameter tensors (parameters, gradients) as one flat vector."""
        return torch.cat([self.local(t).reshape(-1) for t in tensors])

    def pieces(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """A vector as this rank holds it, (..., d), as per-parameter views (..., *local shape)."""
        lead = flat.shape[:-1]
        return [
            piece.view(*lead, *p.shape)
            for piece, p in zip(flat.split(self.sizes, dim=-1), self.parameters, strict=True)
        ]

    def norms(self, V: torch.Tensor) -> list[float]:
        """The whole vectors' norms of the rows of V (K, d)."""
        return [float(v.norm()) for v in V]

    def vectors(self, seed: int) -> Vectors:
        """The job's vectors as this placement holds them: norms, dots and block sums over its layout
        (reduced over the ranks when sharded), per-parameter views, and the seeded Rademacher
        directions' entries it holds."""
        return Vectors(self.layout, self.pieces, seed)

    def forms_engine(self, K: int) -> str:
        """The engine ``auto`` gives quadratic forms of K directions per pass on this model under this
        placement (:func:`tiny_llm.curvature.engines.default_forms_engine`)."""
        from tiny_llm.architectures import jet_rules
        from tiny_llm.curvature.engines import default_forms_engine

        return default_forms_engine(K, jet_rules(self.model), self.sharded)

    def spread(
        self, items: list, compute: Callable[[object], tuple[torch.Tensor, float]]
    ) -> Iterator[tuple[torch.Tensor, float]]:
        """``compute(item)`` → (a whole D-vector, a number) of every item in order. On data-parallel
        ranks each group of N items is spread over the N ranks and gathered by a float64 sum (every
        row filled by one rank), so at most N vectors are held at once; one process, or sharded ranks
        (which compute each item together), compute them in turn."""
        if not self.spreads:
            yield from map(compute, items)
            return
        for start in range(0, len(items), self.ranks):
            group = items[start : start + self.ranks]
            rows = torch.zeros(len(group), self.layout.D + 1, dtype=torch.float64, device=self._device)
            if self.rank < len(group):
                vector, number = compute(group[self.rank])
                rows[self.rank, :-1], rows[self.rank, -1] = vector, number
            all_reduce_sum(rows)
            for position in range(len(group)):
                yield rows[position, :-1], float(rows[position, -1])

    @property
    def _device(self) -> torch.device:
        return self.parameters[0].device

    def deal(self, batches: Batches) -> Batches:
        """This rank's micro-batches of a pass, every N-th from its rank on (all of them on one
        process), as every data-parallel pass deals them (``distributed.shard``)."""
        return list(batches[self.rank :: self.ranks])

    def split(self, units: list) -> list:
        """The units of gradient work (the epoch's batches) this rank computes alone: every N-th on
        data-parallel ranks; all of them on one process, and on sharded ranks, which compute each
        one together (``share``)."""
        return list(units[self.rank :: self.ranks])

    def share(self, micro_batches: Batches) -> Batches:
        """This rank's micro-batches of one unit of gradient work (one batch): all of them unless the
        ranks compute it together (sharded: dealt as a pass's)."""
        return micro_batches

    def reduce_split(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks what ``split`` spread over them (gradients and losses)."""
        return all_reduce_sum(partial)

    def reduce_shared(self, partial: torch.Tensor) -> torch.Tensor:
        """A loss of one unit computed together (``share``) from each rank's part: unchanged unless
        shared (a gradient needs no reduction: FSDP reduce-scatters it)."""
        return partial

    def release(self) -> None:
        """After forward passes without a backward: free what they gathered (nothing unsharded)."""

    def reference(self) -> Placement:
        """The same placement of a float64 copy of the model (the precision audit's), made now."""
        return place(copy.deepcopy(self.model).double())

    def reduce_forms(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum per-rank partial forms (or losses) over the ranks."""
        return all_reduce_sum(partial)

    def reduce_products(self, partial: torch.Tensor) -> torch.Tensor:
        """This rank's products over its micro-batches → the products of every micro-batch."""
        return all_reduce_sum(partial)

    @contextlib.contextmanager
    def shifted(self, step: torch.Tensor | None) -> Iterator[None]:
        """The model's parameters (this rank's parts) moved to θ + ``step`` inside the block (in
        their dtype), restored bit for bit after it, whatever happens; nothing moves for None."""
        if step is None:
            yield
            return
        with self._moved(lambda p, piece: p.add_(piece), step.to(self.parameters[0].dtype)):
            yield

    @contextlib.contextmanager
    def at(self, d: torch.Tensor) -> Iterator[None]:
        """The model's parameters (this rank's parts) at θ + ``d`` inside the block, summed in float64
        and then rounded to their dtype (θ' itself when d = θ' − θ: the loss at a successor), restored
        bit for bit after it, whatever happens. ``shifted`` adds in the parameters' dtype instead (a
        gradient's small step)."""
        with self._moved(lambda p, piece: p.copy_((p.double() + piece.view_as(p)).to(p.dtype)), d):
            yield

    @contextlib.contextmanager
    def _moved(self, move: Callable[[torch.Tensor, torch.Tensor], object], d: torch.Tensor) -> Iterator[None]:
        """Each parameter (this rank's part) moved by ``move(p, its piece of d)`` inside the block,
        restored bit for bit after it."""
        saved = [p.detach().clone() for p in self.parameters]
        try:
            with torch.no_grad():
                for p, piece in zip(self.parameters, self.pieces(d), strict=True):
                    move(p, piece)
            yield
        finally:
            with torch.no_grad():
                for p, value in zip(self.parameters, saved, strict=True):
                    p.copy_(value)

    @contextlib.contextmanager
    def jet_pass(
        self, V: torch.Tensor, adjoints: dict | None, workspace: dict, head_tokens: int | None
    ) -> Iterator[tuple[JetPass, Callable]]:
        """The jet pass of K directions V (K, d) and the loss rule to end it with
        (``loss_jet(h, targets, jets)``)."""
        directions = dict(zip(self.model.parameters(), self.pieces(V), strict=True))
        yield JetPass(directions, adjoints, workspace=workspace, head_tokens=head_tokens), self.model.loss_jet


class Sharded(Placement):
    """The model sharded over the ranks with FSDP2 (module docstring); one rank is the N-rank path
    with trivial collectives."""

    sharded = True
    name = "sharded"
    head_chunks = SHARDED_GRADIENT_HEAD_CHUNKS
    """``model.hidden`` would bypass FSDP's hooks on the root (its parameters' gather and their
    gradients' reduce-scatter), so a sharded gradient takes the head whole."""

    def norms(self, V: torch.Tensor) -> list[float]:
        return self.layout.norms(V.double()).tolist()

    def deal(self, batches: Batches) -> Batches:
        mine = super().deal(batches)
        if len(mine) < -(-len(batches) // self.ranks):  # every rank joins every gather
            inputs, targets = batches[0]
            mine.append((inputs, torch.full_like(targets, IGNORE_INDEX)))
        return mine

    def reduce_products(self, partial: torch.Tensor) -> torch.Tensor:
        return partial  # reduce-scattered already: each rank's rows hold every rank's micro-batches

    spreads = False

    def split(self, units: list) -> list:
        return list(units)  # every rank joins every unit

    def share(self, micro_batches: Batches) -> Batches:
        return self.deal(micro_batches)

    def reduce_split(self, partial: torch.Tensor) -> torch.Tensor:
        return partial

    def reduce_shared(self, partial: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(partial)

    def release(self) -> None:
        self.model.reshard()  # without a backward, the root's unsharded parameters are freed here

    kept: nn.Module | None = None
    """The float64 copy made before the model was sharded (``place``'s ``keep_reference``)."""

    def reference(self) -> Placement:
        if self.kept is None:
            raise RuntimeError(
                "a sharded model's float64 copy is made before it is sharded: place(keep_reference=True)"
            )
        return place(self.kept, sharded=True)

    @contextlib.contextmanager
    def jet_pass(
        self, V: torch.Tensor, adjoints: dict | None, workspace: dict, head_tokens: int | None
    ) -> Iterator[tuple[JetPass, Callable]]:
        from tiny_llm.curvature.sharded_taylor import sharded_jets

        if adjoints is not None:
            raise ValueError("the adjoint mode's record pass does not run on a sharded model")
        with sharded_jets(self.model, self.pieces(V), self.rank, self.ranks, workspace, head_tokens) as pass_and_loss:
            yield pass_and_loss


def place(
    model: nn.Module, sharded: bool = False, keep_reference: bool = False, engine: str | None = None
) -> Placement:
    """The placement of a job's model: ``sharded`` (asked, and in a process group: the model is
    sharded here, in place, with ``shard_model``), else whole or data-parallel over the process
    group's ranks. The one place that answers "is it sharded". ``keep_reference``: keep what
    ``reference`` needs (a sharded model's float64 copy is made here, before it is sharded).

    Raises:
        ValueError: ``engine`` (the job's) does not run under the placement, before any copy or shard.
    """
    rank, ranks = world()
    rows = job_rows([p.shape for p in model.parameters()], sharded)
    placement = "sharded" if rows.sharded else ("data_parallel" if ranks > 1 else "whole")
    if engine is not None:
        from tiny_llm.curvature.engines import engine as engine_named

        engine_named(engine).check_placement(placement)
    if not rows.sharded:
        return Placement(model, Layout(rows.D), rank, ranks)
    kept = copy.deepcopy(model).double() if keep_reference else None
    layout = Layout(rows.D, rows.indices())
    placement = Sharded(shard_model(model), layout, rank, ranks)
    placement.kept = kept
    if sum(placement.sizes) != len(layout.indices):
        raise RuntimeError("FSDP's shards do not follow Shard(0) row chunks; this layout cannot describe them")
    return placement
