"""Data-parallel passes under ``torch.distributed``: each rank takes its share of the micro-batches
of a pass, and the sums are reduced across ranks in float64, so every rank holds the numbers one
process would compute (the order of the summation aside).

Without an initialised process group (a plain run) there is one rank and nothing is reduced.
Under ``torchrun`` (or Slurm's ``srun``) the caller initialises the group; this module only reads
it. Micro-batches are dealt round-robin (rank r takes r, r + N, r + 2N, ...), so an uneven count
and a padded last micro-batch need nothing special: the token weighting of every term is the one
the single-process pass uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

__all__ = ["all_reduce_sum", "is_writer", "shard", "world"]

T = TypeVar("T")


def world() -> tuple[int, int]:
    """(rank, number of ranks) of the current process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items``: every N-th, from its rank on."""
    rank, size = world()
    return list(items[rank::size])


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over the ranks, in place (and returned); unchanged with one rank."""
    if world()[1] > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def is_writer() -> bool:
    """Whether this rank writes results (rank 0: one writer however many ranks compute)."""
    return world()[0] == 0
