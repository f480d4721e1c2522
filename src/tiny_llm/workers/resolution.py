"""A job's settings resolved for its run on a kind of device, without torch: its engines, whether
they run compiled, its curvature micro-batch, TF32, and the grouping of its passes under a memory
budget. The one resolution the campaign's plan, the calibration job and the worker all use (the
worker adds the device and dtype objects: :class:`tiny_llm.workers.loading.Resolved`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiny_llm.config import RunConfig
from tiny_llm.curvature.engines import default_products_engine
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.memory import JobShape, MemoryPlan, plan_analysis
from tiny_llm.workers.settings import AnalysisSettings, quadratic_form_engine

__all__ = ["ITEMSIZE", "Resolution", "memory_plan", "resolve", "runs_compiled"]

PRECONDITIONED_VECTORS = 4
"""The float64 vectors the statistics in the optimizer's geometry add to a job: P, P^{1/2}, and a
sampled gradient and its noise in those coordinates (priced whenever the setting may measure them)."""

ITEMSIZE = {"float64": 8, "float32": 4}
"""Bytes of one number of each analysis dtype."""


@dataclass(frozen=True)
class Resolution:
    """What a job's settings resolve to for its run on a CUDA device or not."""

    engine: str
    """Engine of the quadratic forms."""
    compiled: bool
    tf32: bool
    hvp_batch_size: int
    hvp_engine: str
    """Engine of Hessian-vector products (spectra)."""
    hvp_compiled: bool


def runs_compiled(settings: AnalysisSettings, engine: str, cuda: bool) -> bool:
    """Whether ``engine`` runs compiled: an engine that compiles, on CUDA, with compile_hvp."""
    return cuda and settings.compile_hvp and engine_named(engine).compiled


def resolve(settings: AnalysisSettings, config: RunConfig, cuda: bool) -> Resolution:
    """Resolve a job's settings for its run (engines, compilation, micro-batch, TF32), once.

    Example:
        >>> from tiny_llm.config import RunConfig
        >>> resolve(AnalysisSettings(), RunConfig(), cuda=False).engine
        'adjoint'
    """
    engine = quadratic_form_engine(settings, config.model)
    hvp_engine = default_products_engine(engine, cuda and settings.compile_hvp)
    return Resolution(
        engine=engine,
        compiled=runs_compiled(settings, engine, cuda),
        tf32=cuda and settings.dtype == "float32" and settings.tf32,
        hvp_batch_size=settings.hvp_batch_size or config.training.micro_batch_size,
        hvp_engine=hvp_engine,
        hvp_compiled=runs_compiled(settings, hvp_engine, cuda),
    )


def memory_plan(
    settings: AnalysisSettings,
    config: RunConfig,
    budget_bytes: int | None,
    cuda: bool,
    ranks: int = 1,
    resolution: Resolution | None = None,
) -> MemoryPlan:
    """The grouping of a (state, case) job's passes under ``budget_bytes`` (see
    :func:`tiny_llm.curvature.memory_measure.device_budget`), for a CUDA device or not; with
    ``settings.sharded`` one rank's of ``ranks``. ``resolution``: the job's, when it has resolved
    its settings already (a worker resolves them once).

    Raises:
        ValueError: a pass that does not fit even one sequence at a time (nothing is computed).
    """
    resolution = resolution or resolve(settings, config, cuda)
    return plan_analysis(
        JobShape(
            config=config.model,
            seq_len=config.data.seq_len,
            engine=resolution.engine,
            K=settings.directions_per_pass,
            hvp_batch_size=resolution.hvp_batch_size,
            micro_batch_size=config.training.micro_batch_size,
            itemsize=ITEMSIZE[settings.dtype],
            compiled=resolution.compiled,
            shards=ranks if settings.sharded else 1,
        ),
        audit_directions=settings.audit_directions if settings.audited else None,
        extra_vectors=(config.training.workers if config.training.packed and settings.consensus else 0)
        + (PRECONDITIONED_VECTORS if settings.preconditioned is not False else 0),
        budget_bytes=budget_bytes,
        geometries=2 if settings.preconditioned is not False else 1,
    )
