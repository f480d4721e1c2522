"""How one (state, case) measurement's directions reach the curvature operator: queued and
measured K at a time (a zero direction skips the pass), each record receiving its form and, with a
quadratic-form engine, its Gauss–Newton part; and the directions beside the noise (Rademacher, ḡ,
block-diagonal parts, the packed workers' consensus displacements) queued in the order the
measurement records them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from tiny_llm.curvature.case import CaseInputs
from tiny_llm.curvature.hessian import CurvatureOperator
from tiny_llm.curvature.records import ConsensusWorker, Direction, RandomDirection
from tiny_llm.curvature.vectors import Vectors

__all__ = ["DirectionRunner", "add_block_directions", "queue_other_directions"]


class DirectionRunner:
    """Feeds directions to the forms K at a time; zero directions skip the pass (curvature 0).
    With a quadratic-form engine each record also gets the form's Gauss–Newton part."""

    def __init__(
        self,
        operator: CurvatureOperator,
        K: int,
        split: bool,
        vectors: Vectors,
        total: int,
        dtype: torch.dtype,
        progress: Callable[[str], None],
    ):
        self.operator, self.K, self.split, self.vectors, self.dtype = operator, K, split, vectors, dtype
        self.total, self.progress = total, progress
        self.pending: list[tuple[torch.Tensor, Direction, float]] = []
        self.done, self.started = 0, time.perf_counter()
        self._scale: tuple[torch.Tensor, torch.Tensor] | None = None

    def add(self, vector: torch.Tensor, record: Direction, started: float, scale: torch.Tensor | None = None) -> None:
        """Queue a float64 direction d; ``record`` receives dᵀHd and ‖d‖² of the direction as used.
        With ``scale`` s, d is held in the coordinates u of θ = diag(s) u: the form is of
        H_u = SHS, dᵀ(SHS)d = (s ⊙ d)ᵀH(s ⊙ d), and the norm is u's, ‖d‖²."""
        used = vector.to(self.dtype)
        record.squared_norm = self.vectors.squared_norm(used)
        if scale is not None:
            used = used * self._in_dtype(scale)
        if record.squared_norm == 0.0:
            record.curvature, record.hvp_seconds = 0.0, 0.0
            if self.split:
                record.gauss_newton = 0.0
            record.total_seconds = time.perf_counter() - started
            self.done += 1
            return
        self.pending.append((used, record, started))
        if len(self.pending) == self.K:
            self.flush()

    def _in_dtype(self, scale: torch.Tensor) -> torch.Tensor:
        """``scale`` in the directions' dtype, converted once for the job (not once per direction)."""
        if self._scale is None or self._scale[0] is not scale:
            self._scale = (scale, scale.to(self.dtype))
        return self._scale[1]

    def flush(self) -> None:
        """Measure the queued directions in one pass."""
        if not self.pending:
            return
        started = time.perf_counter()
        V = torch.stack([p[0] for p in self.pending])
        forms, parts = (
            self.operator.split_quadratic_forms(V).tolist()
            if self.split
            else (self.operator.quadratic_forms(V).tolist(), None)
        )
        share = (time.perf_counter() - started) / len(self.pending)
        for i, ((_, record, begun), q) in enumerate(zip(self.pending, forms, strict=True)):
            record.curvature, record.hvp_seconds = q, share
            if parts is not None:
                record.gauss_newton = parts[i]
            record.total_seconds = time.perf_counter() - begun
        self.done += len(self.pending)
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        self.progress(
            f"directions {self.done}/{self.total} ({len(self.pending)} per pass over "
            f"{len(self.operator.batches)} micro-batches, {share * len(self.pending):.2f} s); "
            f"elapsed {elapsed:.1f} s, ETA {eta:.1f} s"
        )
        self.pending = []


def block_parts(
    vector: torch.Tensor, pieces: Callable[[torch.Tensor], list[torch.Tensor]], blocks: list[tuple[str, list[int]]]
) -> Iterator[torch.Tensor]:
    """``vector`` restricted to each parameter block in turn (zero elsewhere); ``pieces`` cuts a
    vector into its per-parameter views."""
    sources = pieces(vector)
    for _, indices in blocks:
        part = torch.zeros_like(vector)
        targets = pieces(part)
        for i in indices:
            targets[i].copy_(sources[i])
        yield part


def add_block_directions(
    runner: DirectionRunner,
    vector: torch.Tensor,
    blocks: list[tuple[str, list[int]]],
    scale: torch.Tensor | None = None,
) -> list[Direction]:
    """Queue ``vector`` restricted to each parameter block (zero elsewhere), so that each form is the
    block-diagonal v_bᵀH_bb v_b (in the coordinates ``scale`` gives, as :meth:`DirectionRunner.add`);
    returns their records, in block order."""
    records = []
    for part in block_parts(vector, runner.vectors.pieces, blocks):
        records.append(Direction())
        runner.add(part, records[-1], time.perf_counter(), scale)
    return records


def queue_other_directions(
    runner: DirectionRunner,
    g_bar: torch.Tensor,
    inputs: CaseInputs,
    blocks: list[tuple[str, list[int]]],
    device: torch.device,
    scale: torch.Tensor | None = None,
) -> tuple[list[RandomDirection], Direction, list[Direction] | None, list[ConsensusWorker]]:
    """Queue every direction but the noise: the seeded Rademacher ones, ḡ (and its block-diagonal
    parts with ``block_curvature``) and the packed workers' consensus displacements; their records.
    With ``scale`` s, in the coordinates u of θ = diag(s) u (:meth:`DirectionRunner.add`): the
    Rademacher directions are u's, the gradient is ḡ_u = s ⊙ ḡ, and there are no consensus
    displacements (a displacement's form is the same in every coordinates)."""
    random = [RandomDirection(index=index) for index in range(inputs.random_samples)]
    for record in random:
        runner.add(runner.vectors.rademacher(record.index).to(device), record, time.perf_counter(), scale)
    gradient, g_u = Direction(), g_bar if scale is None else g_bar * scale
    runner.add(g_u, gradient, time.perf_counter(), scale)
    gradient_blocks = add_block_directions(runner, g_u, blocks, scale) if inputs.block_curvature else None
    displacements = inputs.consensus if scale is None else []
    consensus = [ConsensusWorker(worker=worker) for worker, _ in displacements]
    for record, (_, e) in zip(consensus, displacements, strict=True):
        runner.add(e.to(device), record, time.perf_counter())
    return random, gradient, gradient_blocks, consensus
