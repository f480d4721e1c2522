"""What one (state, case) measurement needs besides the model: the token source (the cache, or a
published training order) and the case's batch plan,
the sampling settings, the engine and its grouping under the memory plan, the audit's size and the
consensus errors of packed runs (``CaseInputs``), shared by the measurement and its audit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from tiny_llm.curvature.memory import MemoryPlan

if TYPE_CHECKING:
    from tiny_llm.curvature.job import Cuts
from tiny_llm.data.tokens import BatchPlan, TokenCache
from tiny_llm.data.training_order import TrainingOrder

__all__ = ["CaseInputs"]


@dataclass
class CaseInputs:
    """What one (state, case) measurement needs besides the model."""

    cache: TokenCache | TrainingOrder
    """Where the batches' tokens come from (``tokens``, ``position``)."""
    plan: BatchPlan
    micro_batch_size: int
    hvp_batch_size: int
    noise_samples: int | None
    random_samples: int
    seed: int
    engine: str
    directions_per_pass: int
    compile: bool
    workers: int = 1
    consensus: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    """(worker index, eᵢ = xᵢ − x̄ as float64 (D,)) for packed runs with consensus on."""
    block_curvature: bool = False
    """Also measure each parameter block's block-diagonal noise and ḡ forms."""
    sharded: bool = False
    """With several ranks, shard the model and every parameter-sized vector over them (FSDP2)."""
    audit: tuple[int, int] | None = None
    """(directions of each kind, curvature micro-batches) of the precision audit, or None."""
    step: torch.Tensor | None = None
    """Δ = θ' − θ to the next checkpoint θ' as float64 (D,), or this rank's shard when sharded (as
    the consensus errors), for the trajectory statistics (:mod:`tiny_llm.curvature.trajectory`);
    None: the state has no successor."""
    preconditioner: torch.Tensor | None = None
    """P's diagonal (float64, as every parameter-sized vector: this rank's rows when sharded), the
    optimizer's preconditioner at the state, in whose coordinates every statistic is also taken;
    None: the plain statistics only."""
    memory: MemoryPlan | None = None
    """Sequences per group of each pass (gradient, forms, audit, audit_gradient) under a memory budget; None:
    unchunked. Grouping changes only how the same terms are summed."""

    @classmethod
    def of(cls, settings: Any, **given: Any) -> CaseInputs:
        """The inputs of a job whose analysis settings are ``settings``: each field that the settings
        also have (the samples, seed, directions per pass, block curvature, sharding) taken from
        them, the others (and any resolved for this machine: the engine, compilation, the curvature
        micro-batch) ``given``."""
        taken = {
            f.name: getattr(settings, f.name) for f in fields(cls) if f.name not in given and hasattr(settings, f.name)
        }
        return cls(**taken, **given)

    def job_cuts(self) -> Cuts:
        """How the job cuts its gradient and forms passes (:class:`tiny_llm.curvature.job.Cuts`)."""
        from tiny_llm.curvature.job import Cuts

        return Cuts(self.micro_batch_size, self.hvp_batch_size, self.directions_per_pass, self.compile, self.memory)
