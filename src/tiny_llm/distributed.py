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

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "all_reduce_sum",
    "barrier",
    "broadcast",
    "init_from_environment",
    "is_writer",
    "OneWriter",
    "rank_note",
    "record",
    "say",
    "shard",
    "single_writer",
    "launched",
    "leave",
    "sharded",
    "world",
]

T = TypeVar("T")


def world() -> tuple[int, int]:
    """(rank, number of ranks) of the current process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def launched() -> tuple[int, int]:
    """(rank, number of ranks) as this process's launcher set them (torchrun's ``RANK`` and
    ``WORLD_SIZE``, or srun's once :func:`init_from_environment` has read them), whether or not it
    has joined the process group: a refusal before joining says which rank it is."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def sharded(asked: bool) -> bool:
    """Whether a job that asked for a sharded model (``sharded: true``) runs sharded: when it asked and
    runs in a process group, however many ranks it has (one rank is the N-rank path with trivial
    collectives). The one answer every part asks (the statistics, spectra, their records)."""
    return asked and dist.is_available() and dist.is_initialized()


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


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a decision taken once, e.g. whether a result is reused)."""
    if world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait until every rank gets here (no-op alone)."""
    if world()[1] > 1:
        dist.barrier()


def say(text: str) -> None:
    """Print ``text`` once, from the writing rank (a command's answer on standard output)."""
    if is_writer():
        print(text)


def rank_note() -> str:
    """`` (rank r of N)`` for a refusal's line under a launcher of several ranks, else nothing (read
    from the launcher's variables: a rank that has not joined its group yet says which it is)."""
    rank, ranks = launched()
    return f" (rank {rank} of {ranks})" if ranks > 1 else ""


class OneWriter:
    """What the ranks of one job share about its one output (``single_writer``)."""

    @staticmethod
    def reuse(check: Callable[[], Any]) -> Any:
        """The value of ``check()`` on the writing rank, on every rank (whether to reuse a finished
        result: every rank computes, or none)."""
        return broadcast(check() if is_writer() else None)

    @staticmethod
    def write(write: Callable[[], Any]) -> None:
        """Run ``write()`` on the writing rank alone (an atomic write of the result)."""
        if is_writer():
            write()


@contextlib.contextmanager
def single_writer(output: Path) -> Iterator[OneWriter]:
    """The write of ``output`` by one rank: rank 0 holds its lock (and clears a killed write's
    temporary files) while every rank computes; the decision to reuse a finished result is rank
    0's, shared with all. Every rank leaves together, after the write."""
    from tiny_llm.io import exclusive, remove_leftovers

    lock = exclusive(output.with_name(f".{output.name}.lock"), f"writing {output}") if is_writer() else None
    failed = False
    with lock or contextlib.nullcontext():
        if is_writer():
            remove_leftovers(output.parent, output.name)
        try:
            yield OneWriter()
        except BaseException:
            failed = True
            raise
        finally:
            if not failed:
                barrier()


def _from_slurm(environ: MutableMapping[str, str]) -> None:
    """Under ``srun`` with several tasks (and no torchrun), torch's variables from those srun sets for
    each task of a step: the rank and local rank of the task, the number of tasks of the step, and
    the first node of the job as the rendezvous (port 20000 + job id mod 10000). A batch script's
    own process (no step of several tasks) stays one process."""
    if "WORLD_SIZE" in environ or int(environ.get("SLURM_STEP_NUM_TASKS", "1")) <= 1 or "SLURM_PROCID" not in environ:
        return
    nodes = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "localhost")
    if any(c in nodes for c in "[,"):
        import subprocess

        nodes = subprocess.run(
            ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    environ.update(
        RANK=environ["SLURM_PROCID"],
        WORLD_SIZE=environ["SLURM_STEP_NUM_TASKS"],
        LOCAL_RANK=environ.get("SLURM_LOCALID", "0"),
        MASTER_ADDR=environ.get("MASTER_ADDR", nodes),
        MASTER_PORT=environ.get("MASTER_PORT", str(20000 + int(environ.get("SLURM_JOB_ID", "0")) % 10000)),
    )


def init_from_environment(device: str) -> None:
    """Join the process group torchrun (or srun, from Slurm's variables) describes: ``WORLD_SIZE`` > 1
    in the environment; gloo on CPU, NCCL for a CUDA ``device``, each rank on ``cuda:LOCAL_RANK``.
    Ranks other than 0 log warnings only. Nothing happens for one process or an existing group."""
    _from_slurm(os.environ)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or (dist.is_available() and dist.is_initialized()):
        return
    from tiny_llm.runtime import die_with_parent

    die_with_parent()  # a rank of a killed launcher (torchrun) stops instead of computing on
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    if dist.get_rank() != 0:
        logging.getLogger("tiny_llm").setLevel(logging.WARNING)


def leave() -> None:
    """Leave the process group this process joined (nothing without one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def record() -> dict[str, Any]:
    """How many ranks computed a result, and over which backend (recorded, not part of its identity:
    the numbers are the same)."""
    size = world()[1]
    return {"ranks": size, "backend": dist.get_backend() if size > 1 else None}
