"""Curvature along the path training took: from a checkpoint θ to its successor θ' = θ + Δ.

On the case's epoch (the same tokens as every other statistic: L the epoch loss, ḡ = ∇L, H = ∇²L at
θ, G its Gauss–Newton part), for the displacement Δ = θ' − θ:

    step_grad_dot        = ḡᵀΔ                       (< 0: the step went downhill at θ)
    step_curvature       = ΔᵀHΔ,   step_gauss_newton = ΔᵀGΔ
    step_sharpness       = ΔᵀHΔ / ‖Δ‖²               (the directional sharpness along the update)
    step_norm            = ‖Δ‖
    optimal_step         = −ḡᵀΔ / ΔᵀHΔ               (the quadratic model's best multiple of Δ; 1 is
                                                       the step taken; null where ΔᵀHΔ ≤ 0: no minimum)
    predicted_loss_change = ḡᵀΔ + ½ ΔᵀHΔ              (the quadratic model's L(θ + Δ) − L(θ))
    actual_loss_change    = L(θ') − L(θ)              (a forward pass at θ' on the same epoch)

Per parameter block b, Δ_b is Δ restricted to the block's parameters (zero elsewhere): ḡ_bᵀΔ_b,
Δ_bᵀH_bbΔ_b (and its Gauss–Newton part), the predicted change ḡ_bᵀΔ_b + ½Δ_bᵀH_bbΔ_b and the actual
L(θ + Δ_b) − L(θ). The forms come from the same engines and passes as the noise forms
(:class:`~tiny_llm.curvature.directions.DirectionRunner`), so the step costs one more direction,
and one per block with ``block_curvature``; the actual losses cost one forward pass over the epoch,
and one per block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tiny_llm.curvature.records import Direction

if TYPE_CHECKING:
    import torch

    from tiny_llm.curvature.directions import DirectionRunner

__all__ = [
    "STEP_STATISTICS",
    "finish_trajectory",
    "queue_step",
    "queue_trajectory",
    "step_block_rows",
    "step_losses",
    "step_statistics",
]

STEP_STATISTICS = (
    "step_grad_dot",
    "step_curvature",
    "step_gauss_newton",
    "step_sharpness",
    "step_norm",
    "optimal_step",
    "predicted_loss_change",
    "actual_loss_change",
)
"""The trajectory statistics of a state with a successor (summary.csv and blocks.csv columns). The
module imports no torch (the collected tables name them)."""


def queue_step(
    runner: DirectionRunner, delta: torch.Tensor, blocks: list[tuple[str, list[int]]], per_block: bool
) -> tuple[Direction, list[Direction] | None]:
    """Queue Δ (and, ``per_block``, each Δ_b) on ``runner``; their records once it is flushed."""
    from tiny_llm.curvature.directions import add_block_directions

    record = Direction()
    runner.add(delta, record, time.perf_counter())
    return record, add_block_directions(runner, delta, blocks) if per_block else None


def step_statistics(grad_dot: float, record: Direction, actual_change: float | None) -> dict[str, Any]:
    """The statistics of one step from ḡᵀΔ, Δ's measured record (form, Gauss–Newton part, ‖Δ‖²) and
    the actual loss change (None where not measured)."""
    curvature, squared = record.curvature, record.squared_norm
    return {
        "step_grad_dot": grad_dot,
        "step_curvature": curvature,
        "step_gauss_newton": record.gauss_newton,
        "step_sharpness": None if squared == 0 else curvature / squared,
        "step_norm": squared**0.5,
        "optimal_step": -grad_dot / curvature if curvature > 0 else None,
        "predicted_loss_change": grad_dot + 0.5 * curvature,
        "actual_loss_change": actual_change,
    }


def step_block_rows(
    grad_dots: list[float], records: list[Direction], actual_changes: list[float | None]
) -> list[dict[str, Any]]:
    """Each block's step statistics, in block order (Δ_b for Δ)."""
    return [step_statistics(*row) for row in zip(grad_dots, records, actual_changes, strict=True)]


def step_losses(
    epoch_loss: Callable[[torch.Tensor | None], float],
    delta: torch.Tensor,
    pieces: Callable[[torch.Tensor], list[torch.Tensor]],
    blocks: list[tuple[str, list[int]]],
    per_block: bool,
) -> tuple[float, list[float] | None]:
    """L(θ + Δ) and, ``per_block``, each L(θ + Δ_b): ``epoch_loss(d)`` is the epoch loss at θ + d."""
    whole = epoch_loss(delta)
    if not per_block:
        return whole, None
    from tiny_llm.curvature.directions import block_parts

    return whole, [epoch_loss(part) for part in block_parts(delta, pieces, blocks)]


@dataclass
class PendingStep:
    """A step queued on a measurement's runner, its records filled once the runner is flushed."""

    delta: torch.Tensor
    loss_at: Callable[[torch.Tensor], float]
    record: Direction
    block_records: list[Direction] | None
    runner: DirectionRunner


def queue_trajectory(
    runner: DirectionRunner,
    step: torch.Tensor | None,
    loss_at: Callable[[torch.Tensor], float],
    blocks: list[tuple[str, list[int]]],
    per_block: bool,
    device: Any,
) -> PendingStep | None:
    """With a step Δ (held as the measurement's vectors are): Δ, and ``per_block`` each Δ_b, queued
    on ``runner``; ``loss_at(d)`` is the epoch loss at θ + d. None without one."""
    if step is None:
        return None
    delta = step.to(device)
    record, block_records = queue_step(runner, delta, blocks, per_block)
    return PendingStep(delta, loss_at, record, block_records, runner)


def finish_trajectory(
    pending: PendingStep | None,
    g_bar: torch.Tensor,
    epoch_loss: float,
    blocks: list[tuple[str, list[int]]],
    statistics: dict[str, Any],
    block_rows: list[dict[str, Any]],
) -> dict[str, Any] | None:
    """The trajectory statistics of a flushed step, whole into ``statistics`` and per block into
    ``block_rows`` (in place); returns the step's record (ḡᵀΔ, its form, Gauss–Newton part and ‖Δ‖²,
    the loss at θ'), None without a step."""
    if pending is None:
        return None
    vectors, delta, per_block = pending.runner.vectors, pending.delta, pending.block_records is not None
    whole, block_losses = step_losses(pending.loss_at, delta, vectors.pieces, blocks, per_block)
    grad_dot = vectors.dot(g_bar, delta)
    statistics.update(step_statistics(grad_dot, pending.record, whole - epoch_loss))
    if per_block:
        changes = [loss - epoch_loss for loss in block_losses]
        found = step_block_rows(vectors.block_dots(g_bar, delta, blocks), pending.block_records, changes)
        for row, values in zip(block_rows, found, strict=True):
            row.update(values)
    record = pending.record
    return {
        "grad_dot": grad_dot,
        "curvature": record.curvature,
        "gauss_newton": record.gauss_newton,
        "squared_norm": record.squared_norm,
        "next_loss": whole,
    }
