"""The measurement records of a (state, case): each measured direction (a noise sample, a Rademacher
direction, a worker's consensus error) with its form, Gauss–Newton part, norm and timing, from
which :mod:`tiny_llm.curvature.statistics` estimates every statistic.

The records are dataclasses while a job measures and plain JSON in a result (``to_json`` and
``from_json`` at that edge, with the keys results have always had), so a saved result is
recomputed by the same code that made it. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["ConsensusWorker", "Direction", "NoiseSample", "RandomDirection", "consensus_block"]


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator == 0 else numerator / denominator


@dataclass
class Direction:
    """A measured direction d: its form dᵀHd, the form's Gauss–Newton part dᵀGd (quadratic-form
    engines), ‖d‖² as used, and the time its share of the passes took."""

    curvature: float | None = None
    gauss_newton: float | None = None
    squared_norm: float = 0.0
    hvp_seconds: float = 0.0
    total_seconds: float = 0.0


@dataclass
class NoiseSample(Direction):
    """A sampled effective batch i: gᵢ's norm and loss, and vᵢ = gᵢ − ḡ as a direction."""

    batch_index: int = 0
    stream_batch: int = 0
    positions: Any = None
    grad_norm: float = 0.0
    loss: float = 0.0
    worker: int | None = None
    """The local-SGD worker that trained on this batch (packed runs)."""
    block_grad_squared_norms: list[float] | None = None
    """‖gᵢ,b‖² of each parameter block b (:mod:`tiny_llm.curvature.blocks`), in the result's order."""
    block_noise_squared_norms: list[float] | None = None
    """‖vᵢ,b‖² of each parameter block b, of vᵢ as used."""
    block_noise_curvatures: list[float] | None = None
    """vᵢ,bᵀH_bb vᵢ,b of each parameter block b (with the block_curvature setting)."""

    @property
    def noise_norm(self) -> float:
        """‖vᵢ‖."""
        return math.sqrt(self.squared_norm)

    def to_json(self) -> dict[str, Any]:
        """The record as a result saves it."""
        record = {
            "batch_index": self.batch_index,
            "stream_batch": self.stream_batch,
            "positions": self.positions,
            "grad_norm": self.grad_norm,
            "loss": self.loss,
            **({} if self.worker is None else {"worker": self.worker}),
            "noise_curvature": self.curvature,
            "hvp_seconds": self.hvp_seconds,
            **({} if self.gauss_newton is None else {"noise_gauss_newton": self.gauss_newton}),
            "total_seconds": self.total_seconds,
            "noise_squared_norm": self.squared_norm,
            "noise_norm": self.noise_norm,
        }
        if self.block_grad_squared_norms is not None:
            record["block_grad_squared_norms"] = self.block_grad_squared_norms
            record["block_noise_squared_norms"] = self.block_noise_squared_norms
        if self.block_noise_curvatures is not None:
            record["block_noise_curvatures"] = self.block_noise_curvatures
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> NoiseSample:
        """The record of a saved result."""
        names = {f.name for f in fields(cls)} - {"curvature", "gauss_newton", "squared_norm"}
        return cls(
            curvature=record["noise_curvature"],
            gauss_newton=record.get("noise_gauss_newton"),
            squared_norm=record.get("noise_squared_norm", record["noise_norm"] ** 2),
            **{k: v for k, v in record.items() if k in names},
        )


@dataclass
class RandomDirection(Direction):
    """Rademacher direction ``index``."""

    index: int = 0

    def to_json(self) -> dict[str, Any]:
        """The record as a result saves it (its norm² is D)."""
        return {
            "index": self.index,
            "curvature": self.curvature,
            **({} if self.gauss_newton is None else {"gauss_newton": self.gauss_newton}),
            "hvp_seconds": self.hvp_seconds,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> RandomDirection:
        """The record of a saved result."""
        return cls(
            index=record.get("index", 0),
            curvature=record["curvature"],
            gauss_newton=record.get("gauss_newton"),
            hvp_seconds=record.get("hvp_seconds", 0.0),
        )


@dataclass
class ConsensusWorker(Direction):
    """A local-SGD worker's consensus error eᵢ = xᵢ − x̄ as a direction (packed runs)."""

    worker: int = 0

    def to_json(self) -> dict[str, Any]:
        """The record as a result saves it."""
        return {
            "worker": self.worker,
            "curvature": self.curvature,
            "hvp_seconds": self.hvp_seconds,
            **({} if self.gauss_newton is None else {"gauss_newton": self.gauss_newton}),
            "total_seconds": self.total_seconds,
            "squared_norm": self.squared_norm,
            "norm": math.sqrt(self.squared_norm),
            "normalized_alignment": _ratio(self.curvature, self.squared_norm),
        }


def consensus_block(workers: list[ConsensusWorker]) -> dict[str, Any]:
    """The consensus block of a result: every worker's record and their aggregate."""
    q = math.fsum(w.curvature for w in workers)
    ee = math.fsum(w.squared_norm for w in workers)
    return {
        "workers": [w.to_json() for w in workers],
        "aggregate": {
            "mean_curvature": q / len(workers),
            "normalized_alignment": _ratio(q, ee),
            "mean_norm": math.fsum(math.sqrt(w.squared_norm) for w in workers) / len(workers),
        },
    }
