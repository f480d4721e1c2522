"""A cross-seed experiment's settings (``seed_experiments.<name>.settings``) and what they cost
before anything runs: the analysis set-up whose timing entry prices a measurement, and the work of
one checkpoint's measurement in that entry's units. Torch-free, for the planner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from tiny_llm.config import RunConfig
from tiny_llm.declared import Bounds, NonNegative, Positive, PositiveNumber, build, check_fields
from tiny_llm.workers.settings import AnalysisSettings

__all__ = [
    "GeometrySettings",
    "as_analysis_settings",
    "geometry_settings_from_dict",
    "measurement_seconds",
    "measurement_work",
]


@dataclass(frozen=True)
class GeometrySettings:
    """How a cross-seed experiment measures each checkpoint (``seed_experiments.<name>.settings``)."""

    reference_rows: Positive = 16
    """Sequences of the reference set (loss, reference gradient, function-space probes)."""
    held_out: bool = True
    """Cut the reference set from the unseen stream (true) or from the first training epoch (false)."""
    cov_num_batches: Annotated[int, Bounds(2)] = 4
    """Batches of the covariance probe (at least 2)."""
    cov_batch_size: Positive = 2
    """Sequences per covariance batch."""
    top_k: Positive = 2
    """Dimension k of the dominant subspaces (at most cov_num_batches)."""
    hutchinson_samples: Positive = 8
    """Rademacher probes for the Hessian trace and for the Jacobian Frobenius norm."""
    hessian_proxy_every: NonNegative = 1
    """Hessian trace and Jacobian norm at every N-th checkpoint (0: never)."""
    hessian_eig_every: NonNegative = 1
    """Hessian top eigenvalue and gradient alignment at every N-th checkpoint (0: never)."""
    lanczos_steps: Positive = 100
    """Most Lanczos steps for the top eigenvalue (it stops once the eigenpair converges)."""
    lanczos_tolerance: PositiveNumber | None = None
    """Converged: ‖Hu − λu‖ ≤ this · |λ|; null: 1e-6 in float64, 1e-3 in float32."""
    hvp_batch_size: Positive = 8
    """Sequences per curvature micro-batch."""
    llc_every: NonNegative = 0
    """Local learning coefficient at every N-th checkpoint (0: never; needs the optional devinterp)."""
    llc_chains: Positive = 4
    """SGLD chains for the local learning coefficient."""
    llc_draws: Positive = 100
    """SGLD draws per chain."""
    llc_lr: float = 1e-4
    """SGLD step size."""
    llc_n_beta: float | None = None
    """SGLD inverse temperature nβ (null: N / ln N for the N reference tokens)."""
    llc_localization: float = 100.0
    """SGLD pull towards the measured parameters (γ)."""
    seed: int = 0
    """Seed of the Hutchinson and Lanczos probes and of the SGLD chains."""
    device: str = "cpu"
    """cpu, cuda, cuda:N or auto."""
    dtype: Literal["float64", "float32"] = "float64"
    """float64 or float32."""

    def __post_init__(self):
        check_fields(self)  # types, literals and ranges, as the loader checks them; cross-field below
        if self.top_k > self.cov_num_batches:
            raise ValueError(f"top_k ({self.top_k}) must not exceed cov_num_batches ({self.cov_num_batches})")


def geometry_settings_from_dict(data: dict[str, Any] | None) -> GeometrySettings:
    """Settings from a config mapping; unknown keys are an error that lists the known ones."""
    return build(GeometrySettings, dict(data or {}))


def as_analysis_settings(settings: GeometrySettings) -> AnalysisSettings:
    """The analysis setup whose timing entry prices a measurement: its device, precision, curvature
    micro-batch and the directions a Hutchinson pass carries (exact quadratic forms, adjoint)."""
    return AnalysisSettings(
        device=settings.device,
        dtype=settings.dtype,
        hvp_batch_size=settings.hvp_batch_size,
        directions_per_pass=min(settings.hutchinson_samples, 8),
        engine="adjoint",
        compile_hvp=False,
    )


def measurement_work(config: RunConfig, settings: GeometrySettings) -> dict[str, int]:
    """The work of measuring one checkpoint with every metric due, in the units of a timing entry:
    gradient micro-batches (gradients, Jacobian-vector and vector-Jacobian products and per-row
    gradients, each about one forward and backward over the reference rows) and passes of a
    curvature micro-batch (Hutchinson passes of up to 8 directions, one per Lanczos step)."""
    mb = config.training.micro_batch_size
    reference = math.ceil(settings.reference_rows / mb)
    per_batch = math.ceil(settings.cov_batch_size / mb)
    gradient = (
        reference
        + settings.cov_num_batches * per_batch
        + settings.cov_num_batches * reference
        + reference
        + settings.hutchinson_samples * reference
    )
    curvature_batches = math.ceil(settings.reference_rows / settings.hvp_batch_size)
    passes = (
        math.ceil(settings.hutchinson_samples / min(settings.hutchinson_samples, 8)) + settings.lanczos_steps
    ) * curvature_batches
    return {"gradient_microbatches": gradient, "hvp_microbatch_passes": passes}


def measurement_seconds(config: RunConfig, settings: GeometrySettings, seconds: dict[str, float]) -> float:
    """Estimated seconds of one checkpoint's measurement from a timing entry's ``seconds``."""
    work = measurement_work(config, settings)
    return (
        seconds.get("process", 0.0)
        + seconds["startup"]
        + work["gradient_microbatches"] * seconds["gradient_microbatch"]
        + work["hvp_microbatch_passes"] * seconds["hvp_microbatch_pass"]
    )
