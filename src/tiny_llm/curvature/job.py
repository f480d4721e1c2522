"""One job: a model under its placement and precision, the epoch's batches and how its passes are
cut, opened once by :func:`open_job`. Every gradient, loss and curvature pass of a job runs through
it: the mean gradient and epoch loss, the batch gradients (sampled, spread over data-parallel ranks),
the loss at a shifted θ, and the curvature operator (``EpochHessian``, built here and nowhere else
in the package), all with the one micro-batch gradient of :mod:`tiny_llm.model.micro_batch` and
the placement's one dealing rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from tiny_llm.curvature import gradients
from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.curvature.memory import MemoryPlan
from tiny_llm.curvature.placement import Placement, place

__all__ = ["Cuts", "Job", "open_job"]


@dataclass(frozen=True)
class Cuts:
    """How a job cuts its work: training's micro-batch (its gradients replay it), the curvature
    micro-batch, K directions per pass, compilation, and the memory plan's group rows and head
    chunks, read under the names of the job's gradient and curvature passes (``passes``: the
    analysis's ``gradient`` and ``forms``, the audit's ``audit_gradient`` and ``audit``, a
    spectrum's ``gradient`` and ``products``)."""

    micro_batch_size: int
    hvp_batch_size: int
    directions_per_pass: int = 1
    compile: bool = False
    memory: MemoryPlan | None = None
    passes: tuple[str, str] = ("gradient", "forms")

    @property
    def gradient_rows(self) -> int:
        """Sequences per backward pass of a gradient: training's micro-batch, or fewer to fit the
        memory budget (the same sum)."""
        return (self.memory.rows(self.passes[0]) if self.memory else None) or self.micro_batch_size

    @property
    def head_tokens(self) -> int | None:
        """Target positions a gradient's head and loss take at a time (None: all at once)."""
        return self.memory.head_tokens(self.passes[0]) if self.memory else None

    def curvature(self) -> dict[str, int | None]:
        """The curvature pass's ``group_rows`` and ``head_tokens`` (none without a memory plan)."""
        return self.memory.cuts(self.passes[1]) if self.memory else {}


class Job:
    """A job's model, placement, precision, batches and cuts (module docstring); made by
    :func:`open_job`."""

    def __init__(self, model: torch.nn.Module, batches: list[torch.Tensor], cuts: Cuts, precision: Precision,
                 placement: Placement, progress: Callable[[str], None] | None = None):  # fmt: skip
        self.model, self.batches, self.cuts, self.precision = model, batches, cuts, precision
        self.placement, self.progress = placement, progress

    def _gradient_arguments(self) -> tuple:
        return self.cuts.gradient_rows, self.precision, self.cuts.head_tokens

    def mean_gradient_and_loss(self) -> tuple[torch.Tensor, float]:
        """ḡ and the epoch loss over every batch (:func:`gradients.mean_gradient_and_loss`)."""
        return gradients.mean_gradient_and_loss(self.model, self.placement, self.batches, *self._gradient_arguments())

    def batch_gradient_and_loss(self, tokens: torch.Tensor | int) -> tuple[torch.Tensor, float]:
        """gᵢ and the loss of one optimizer batch: its tokens, or the index of one of the job's."""
        tokens = self.batches[tokens] if isinstance(tokens, int) else tokens
        return gradients.batch_gradient_and_loss(self.model, self.placement, tokens, *self._gradient_arguments())

    def sampled(
        self, selected: list[int], known: dict[int, tuple[torch.Tensor, float]]
    ) -> Iterator[tuple[torch.Tensor, float]]:
        """(gᵢ, loss) of the selected batches in order, those ``known`` reused (and dropped once
        given), spread over data-parallel ranks (``Placement.spread``)."""
        given = self.placement.spread(selected, lambda i: known.get(i) or self.batch_gradient_and_loss(i))
        for i, pair in zip(selected, given, strict=True):
            known.pop(i, None)
            yield pair

    def epoch_loss(self) -> float:
        """The epoch loss from forward passes only (the same number as the mean gradient's)."""
        return gradients.epoch_loss(self.model, self.batches, *self._gradient_arguments(), self.placement)

    def loss_at(self, step: torch.Tensor) -> float:
        """The epoch loss at θ + ``step`` (held as every vector is), θ restored exactly after."""
        with self.placement.at(step):
            return self.epoch_loss()

    def operator(self, engine: str, tokens: torch.Tensor | None = None, directions: int | None = None) -> EpochHessian:
        """The epoch Hessian of the job's batches (or of ``tokens``) by ``engine``, K directions per
        pass (``directions``, else the cuts'), cut as the job's curvature pass."""
        return EpochHessian(
            self.model,
            torch.cat(self.batches) if tokens is None else tokens,
            batch_size=self.cuts.hvp_batch_size,
            engine=engine,
            precision=self.precision,
            directions_per_pass=directions or self.cuts.directions_per_pass,
            compile=self.cuts.compile and directions is None,
            progress=self.progress,
            **self.cuts.curvature(),
            placement=self.placement,
        )

    def reference(self, placement: Placement | None = None) -> Job:
        """The same job in float64 on the model's float64 copy (``Placement.reference``; or on
        ``placement``, a float64 model placed as this one), its passes cut as the memory plan's
        precision audit's (``audit_gradient``, ``audit``)."""
        placement = placement or self.placement.reference()
        exact, passes = Precision(self.precision.device, torch.float64), ("audit_gradient", "audit")
        cuts = replace(self.cuts, passes=passes, compile=False)
        return Job(placement.model, self.batches, cuts, exact, placement, self.progress)


def open_job(
    model: torch.nn.Module,
    batches: list[torch.Tensor],
    cuts: Cuts,
    precision: Precision,
    placement: Placement | None = None,
    progress: Callable[[str], None] | None = None,
) -> Job:
    """The job of ``model`` on ``batches`` ((B, T+1) token rows each), cut by ``cuts``, in
    ``precision``, under ``placement`` (None: the model whole, on one process or data-parallel
    ranks; a sharded job places its model first, :func:`tiny_llm.curvature.placement.place`)."""
    return Job(model, batches, cuts, precision, placement or place(model), progress)
