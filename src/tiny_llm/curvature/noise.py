"""Gradient-noise and curvature statistics of one parameter state on one data case.

Definitions: the epoch loss L is the token-mean cross-entropy over
every target token of the case's epoch (reported as ``loss``); H = ∇²L, ḡ = ∇L. An effective batch i (one optimizer
batch, accumulated over training's micro-batches) gives gᵢ, and vᵢ = gᵢ − ḡ. sᵢ are Rademacher
directions; D counts unique trainable parameters.

    noise_curvature      = Σ vᵢᵀHvᵢ / S_v
    normalized_alignment = Σ vᵢᵀHvᵢ / Σ‖vᵢ‖²            (null when Σ‖vᵢ‖² = 0)
    mean_noise_norm      = mean ‖vᵢ‖,  mean_grad_norm = mean ‖gᵢ‖,  full_grad_norm = ‖ḡ‖
    random_curvature     = Σ sᵢᵀHsᵢ / (D·S_r)            (→ tr(H)/D)
    grad_curvature       = ḡᵀHḡ
    gradient_sharpness   = ḡᵀHḡ / ‖ḡ‖²                  (the curvature along ḡ; null when ḡ = 0)
    gradient_step        = ‖ḡ‖² / ḡᵀHḡ                  (the quadratic model's best step along −ḡ,
                                                        minimising L(θ − ηḡ) ≈ L − η‖ḡ‖² + ½η²ḡᵀHḡ;
                                                        null when ḡᵀHḡ ≤ 0)
    b_simple             = B·c·mean‖vᵢ‖² / ‖ḡ‖²         (null when ‖ḡ‖ = 0)
    b_noise              = B·c·mean(vᵢᵀHvᵢ) / ḡᵀHḡ        (null when ḡᵀHḡ ≤ 0)

Gauss–Newton split (taylor and adjoint engines; null with the HVP engines): H = G + R, where
G = Jᵀ∇²ℓ J is the generalised Gauss–Newton matrix (J the Jacobian of the logits, ∇²ℓ the
token-mean softmax cross-entropy Hessian diag(p) − ppᵀ) and R the residual Σ ∂ℓ/∂z · ∇²z. The
loss rule computes vᵀGv on its way to vᵀHv, so every form comes with its part at no extra pass:

    noise_gauss_newton   = Σ vᵢᵀGvᵢ / S_v
    random_gauss_newton  = Σ sᵢᵀGsᵢ / (D·S_r)            (→ tr(G)/D)
    grad_gauss_newton    = ḡᵀGḡ

G is positive semi-definite, so these are ≥ 0 and a negative form is the residual's; the residual
of each is the statistic minus its part (e.g. noise_curvature − noise_gauss_newton).

B_simple and B_noise are McCandlish et al. (2018) with B the effective batch size in sequences
and c = (M − 1)/(M − B) the finite-population correction for batches of B drawn without
replacement from the epoch's M = n·B sequences (E‖vᵢ‖² = tr(Σ)/B · (M − B)/(M − 1)); both are
null when the epoch is a single batch. All reductions are float64.

Preconditioned (with the optimizer's preconditioner P at the state, ``preconditioned``): every
statistic above but the loss, in the coordinates u = P^{-1/2}θ, where ḡ_u = P^{1/2}ḡ,
H_u = P^{1/2}HP^{1/2} and vᵢ,u = P^{1/2}vᵢ (P: :mod:`tiny_llm.model.moments`): B_simple,P =
B·c·mean vᵢᵀPvᵢ / ḡᵀPḡ, B_noise,P = B·c·mean (Pvᵢ)ᵀH(Pvᵢ) / ḡᵀPHPḡ, gradient_sharpness
ḡᵀPHPḡ / ḡᵀPḡ, gradient_step ḡᵀPḡ / ḡᵀPHPḡ (the best η of the step −ηPḡ), random_curvature
tr(PH)/D, with the same standard errors.

Standard errors (``standard_errors``, key ``<statistic>_se``) say how far a statistic estimated
from samples can be from its exact value for this state and case. loss, full_grad_norm and
grad_curvature are computed over the whole epoch and have none. The S_v noise batches are drawn
without replacement from the epoch's n batches, so their means carry the finite-population factor:

    se(mean of xᵢ)       = sqrt((1 − S_v/n) · s²/S_v)     (s²: sample variance, ddof 1; 0 when S_v = n)
    se(random_curvature) = sqrt(s²/S_r) / D                (Rademacher directions: no finite population)
    se(Σaᵢ/Σbᵢ)          = sqrt((1 − S_v/n) · Σ(aᵢ − R bᵢ)²/(S_v − 1) / S_v) / mean bᵢ   (delta method)
    se(b_simple)         = B·c·se(mean ‖vᵢ‖²) / ‖ḡ‖²,   se(b_noise) = B·c·se(mean vᵢᵀHvᵢ) / ḡᵀHḡ

(ḡ and ḡᵀHḡ are exact). A standard error is null when its statistic is, or with a single sample.

Precision audit (``audit``, when enabled; it runs first in the job): :mod:`tiny_llm.curvature.audit`.
The statistics are declared, with their standard errors and implied audit errors, in
:mod:`tiny_llm.curvature.statistics`; the gradients and seeded draws are :mod:`tiny_llm.curvature.gradients`'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tiny_llm.curvature.audit import audit_choice, audit_sides, precision_audit
from tiny_llm.curvature.blocks import model_blocks
from tiny_llm.curvature.case import CaseInputs
from tiny_llm.curvature.directions import DirectionRunner, add_block_directions, queue_other_directions
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.curvature.gradients import (
    noise_batch_indices,
)
from tiny_llm.curvature.hessian import CurvatureOperator, Precision
from tiny_llm.curvature.job import Job, open_job
from tiny_llm.curvature.measurement import MeasurementPlan
from tiny_llm.curvature.placement import place
from tiny_llm.curvature.records import ConsensusWorker, Direction, NoiseSample, RandomDirection, consensus_block
from tiny_llm.curvature.statistics import (
    Samples,
    block_statistics,
    standard_errors,
    summarise,
)
from tiny_llm.curvature.trajectory import finish_trajectory, queue_trajectory
from tiny_llm.curvature.vectors import Vectors
from tiny_llm.model.llama import Llama

__all__ = ["CaseInputs", "measure_case"]

log = logging.getLogger(__name__)


@dataclass
class _Setup:
    """What a measurement reads through its job: the vectors, the gradients, the forms."""

    job: Job
    vectors: Vectors
    split: bool
    """Whether the forms come with their Gauss–Newton part (an engine that declares one)."""
    scales: list[torch.Tensor | None]
    """The coordinates θ = diag(s) u every statistic is taken in: None (the plain ones) and, with a
    preconditioner P, s = P^{1/2} (float64, held as every vector is)."""
    engine: str
    """The forms' engine."""

    def operator(self) -> CurvatureOperator:
        """The job's curvature operator by its engine."""
        return self.job.operator(self.engine)


def _setup(model: Llama, batches: list[torch.Tensor], inputs: CaseInputs, precision: Precision) -> _Setup:
    """The job (its placement: ``inputs.sharded`` in a process group, the model sharded over the
    ranks with FSDP2, here, in place, every vector this rank's shard; else whole, on one process or
    data-parallel ranks) and everything read through it. An engine that does not run under the
    placement is refused by name before any copy or shard."""
    placement = place(model, inputs.sharded, keep_reference=bool(inputs.audit), engine=inputs.engine)
    job = open_job(model, batches, inputs.job_cuts(), precision, placement)
    P = inputs.preconditioner
    return _Setup(
        job=job,
        vectors=placement.vectors(inputs.seed),
        split=engine_named(inputs.engine).gauss_newton,
        scales=[None] + ([] if P is None else [P.to(precision.device, torch.float64).sqrt()]),
        engine=inputs.engine,
    )


def _audit_first(
    setup: _Setup,
    mean: tuple[torch.Tensor, float],
    selected: list[int],
    inputs: CaseInputs,
    sampled: dict[int, tuple[torch.Tensor, float]],
    progress: Callable[[str], None],
) -> dict[str, Any] | None:
    """The precision audit, when asked for, first in the job: its memory and its verdict are known
    before the long part (``mean``: the production ḡ and epoch loss). Its production batch
    gradients are left in ``sampled``."""
    if not inputs.audit:
        return None
    a = inputs.audit[0]
    audited_noise = [selected[p] for p in audit_choice(len(selected), a, inputs.seed, 0)]
    audited_random = audit_choice(inputs.random_samples, a, inputs.seed, 1)
    progress(
        f"precision audit: ḡ and loss in float64, {len(audited_noise)} noise, {len(audited_random)} random "
        f"directions and ḡ on {inputs.audit[1]} curvature micro-batches"
        + (", in the plain and the optimizer's geometry" if len(setup.scales) > 1 else "")
    )
    scale = setup.scales[1] if len(setup.scales) > 1 else None  # every geometry the job measures
    audited = (audited_noise, audited_random)
    audit = precision_audit(audit_sides(setup.job, inputs), mean, audited, inputs, sampled, scale)
    progress(
        f"precision audit: largest implied statistic error {audit['max_statistic_relative_error']:.2e} "
        f"({audit['seconds']:.2f} s)"
    )
    return audit


@dataclass
class _Queued:
    """The records of one coordinates' directions, queued (their forms arrive at the flush): those
    of θ = diag(s) u with s = ``scale`` (None: the plain coordinates)."""

    scale: torch.Tensor | None
    noise: list[NoiseSample] = field(default_factory=list)
    block_forms: dict[int, list[Direction]] = field(default_factory=dict)
    """batch index -> its block-diagonal forms (with ``block_curvature``)."""
    random: list[RandomDirection] = field(default_factory=list)
    gradient: Direction = field(default_factory=Direction)
    gradient_blocks: list[Direction] | None = None

    def covector(self, g: torch.Tensor) -> torch.Tensor:
        """A gradient in these coordinates: gᵤ = s ⊙ g."""
        return g if self.scale is None else g * self.scale

    def samples(self, g_bar: torch.Tensor, vectors: Vectors, B: int, M: int) -> Samples:
        """The statistics' samples, once measured."""
        _block_forms_measured(self.noise, self.block_forms, self.gradient_blocks)
        return Samples(
            self.noise,
            self.random,
            vectors.norm(self.covector(g_bar)),
            self.gradient.curvature,
            vectors.layout.D,
            B,
            M,
            self.gradient.gauss_newton,
        )

    def measured(self) -> list[Direction]:
        """Every direction measured (for the timing)."""
        blocks = (d for forms in self.block_forms.values() for d in forms)
        return [*self.noise, *self.random, self.gradient, *(self.gradient_blocks or []), *blocks]


def _noise_samples(
    setup: _Setup,
    g_bar: torch.Tensor,
    selected: list[int],
    sampled: dict[int, tuple[torch.Tensor, float]],
    inputs: CaseInputs,
    runner: DirectionRunner,
    blocks: list[tuple[str, list[int]]],
) -> tuple[list[_Queued], float]:
    """The sampled batches' records (with their squared norms per parameter block), their noise
    directions vᵢ = gᵢ − ḡ queued on ``runner``, the seconds their gradients took (``sampled``:
    those the audit computed already) and, with ``block_curvature``, each batch's block-diagonal
    forms' records: one list of records and forms for each coordinates θ = diag(s) u of
    ``setup.scales`` (None: the plain ones), each gradient gᵢ taken once (in u, gᵢ,u = s ⊙ gᵢ)."""
    plan, vectors, seconds = inputs.plan, setup.vectors, 0.0
    queued = [_Queued(scale) for scale in setup.scales]
    gradients = setup.job.sampled(selected, sampled)
    for i in selected:
        started = time.perf_counter()
        g, batch_loss = next(gradients)
        seconds += time.perf_counter() - started
        for q in queued:
            g_u = q.covector(g)
            record = NoiseSample(
                batch_index=i,
                stream_batch=int(plan.stream_batches[i]),
                positions=plan.positions(inputs.cache, i),
                grad_norm=vectors.norm(g_u),
                loss=batch_loss,
                worker=int(plan.stream_batches[i]) % inputs.workers if inputs.workers > 1 else None,
                block_grad_squared_norms=vectors.block_squared_norms(g_u, blocks),
            )
            v = q.covector(g - g_bar)
            record.block_noise_squared_norms = vectors.block_squared_norms(v.to(runner.dtype), blocks)  # as used
            q.noise.append(record)
            runner.add(v, record, started, q.scale)
            if inputs.block_curvature:
                q.block_forms[record.batch_index] = add_block_directions(runner, v, blocks, q.scale)
    return queued, seconds


def _counts(samples: Samples, inputs: CaseInputs, operator: CurvatureOperator) -> dict[str, Any]:
    """What a (state, case) counted: parameters, the epoch's batches, sequences and tokens, the
    samples, the batch sizes and the passes over the data."""
    return {
        "parameters_D": samples.D,
        "epoch_batches": samples.n,
        "epoch_sequences": samples.M,
        "epoch_tokens": operator.n_targets,
        "noise_samples": len(samples.noise),
        "random_samples": len(samples.random),
        "effective_batch_size": samples.B,
        "micro_batch_size": inputs.micro_batch_size,
        "hvp_batch_size": inputs.hvp_batch_size,
        "hvp_batches": len(operator.batches),
        "directions_per_pass": inputs.directions_per_pass,
        "hvp_passes": operator.passes,
        "finite_epoch_correction": samples.correction,
    }


def _block_rows(
    samples: Samples,
    setup: _Setup,
    sizes: list[int],
    blocks: list[tuple[str, list[int]]],
    g_bar: torch.Tensor,
    gradient_blocks: list[Direction] | None,
) -> list[dict[str, Any]]:
    """Each parameter block's statistics, from the same declarations as the whole model's."""
    return block_statistics(
        samples,
        [name for name, _ in blocks],
        [sum(sizes[i] for i in indices) for _, indices in blocks],
        setup.vectors.block_squared_norms(g_bar, blocks),
        None if gradient_blocks is None else [d.curvature for d in gradient_blocks],
    )


def _block_forms_measured(
    noise: list[NoiseSample], block_forms: dict[int, list[Direction]], gradient_blocks: list[Direction] | None
) -> list[Direction]:
    """Each noise sample's block-diagonal forms onto its record, once measured; every block form's
    record (for the timing)."""
    for record in noise:
        if record.batch_index in block_forms:
            record.block_noise_curvatures = [d.curvature for d in block_forms[record.batch_index]]
    return [*(gradient_blocks or []), *(d for forms in block_forms.values() for d in forms)]


def _queue_others(
    queued: list[_Queued], runner: DirectionRunner, g_bar: torch.Tensor, inputs: CaseInputs, blocks
) -> list[ConsensusWorker]:
    """The directions beside the noise queued in each coordinates (:func:`queue_other_directions`),
    onto their records; the consensus workers' records (plain coordinates only)."""
    consensus = []
    for q in queued:
        q.random, q.gradient, q.gradient_blocks, workers = queue_other_directions(
            runner, g_bar, inputs, blocks, g_bar.device, q.scale
        )
        consensus += workers
    return consensus


def _statistics(samples: Samples, setup: _Setup, sizes: list[int], blocks, g_bar, queued: _Queued) -> dict:
    """The statistics of one coordinates, their standard errors and blocks, and their records."""
    return {
        "statistics": summarise(samples),
        "standard_errors": standard_errors(samples),
        "blocks": _block_rows(samples, setup, sizes, blocks, queued.covector(g_bar), queued.gradient_blocks),
        "noise_samples": [r.to_json() for r in queued.noise],
        "random_directions": [r.to_json() for r in queued.random],
    }


def _plan(inputs: CaseInputs, n: int, blocks: int, geometries: int, hvp_batches: int) -> MeasurementPlan:
    """The job's counts (:class:`MeasurementPlan`), as the planner's price counts them."""
    return MeasurementPlan.of(
        n,
        inputs.noise_samples,
        inputs.random_samples,
        consensus=len(inputs.consensus),
        blocks=blocks,
        step=inputs.step is not None,
        geometries=geometries,
        hvp_batches=hvp_batches,
        audit=inputs.audit[0] if inputs.audit else 0,
        audit_batches=inputs.audit[1] if inputs.audit else 0,
    )


def measure_case(
    model: Llama, inputs: CaseInputs, precision: Precision, progress: Callable[[str], None] = log.info
) -> dict[str, Any]:
    """Every statistic of one (state, case): records, statistics, counts, timing (plain data); with
    ``inputs.preconditioner`` P, also in the optimizer's coordinates u = P^{-1/2}θ (``preconditioned``).

    With ``inputs.sharded`` in a process group the model is sharded over its ranks (in place; pass it on
    the host, FSDP2 moves each rank's shards to the device) and every parameter-sized vector is a
    shard; the statistics are the same."""
    t0 = time.perf_counter()
    batches = [inputs.cache.tokens(blocks) for blocks in inputs.plan.blocks]
    B, n = len(inputs.plan.blocks[0]), len(inputs.plan)
    setup = _setup(model, batches, inputs, precision)
    vectors = setup.vectors
    g_bar, epoch_loss = setup.job.mean_gradient_and_loss()
    t_mean = time.perf_counter() - t0
    progress(f"mean gradient over {n} batches: {t_mean:.2f} s (epoch loss {epoch_loss:.4f})")

    operator = setup.operator()
    blocks = model_blocks(operator.flat.names, inputs.block_curvature, progress)
    plan = _plan(inputs, n, len(blocks) if inputs.block_curvature else 0, len(setup.scales), len(operator.batches))
    selected = noise_batch_indices(n, inputs.noise_samples, inputs.seed)
    sampled: dict[int, tuple[torch.Tensor, float]] = {}  # the audit's production batch gradients, reused
    audit = _audit_first(setup, (g_bar, epoch_loss), selected, inputs, sampled, progress)
    runner = DirectionRunner(operator, operator.K, setup.split, vectors, plan.directions, precision.dtype, progress)
    queued, sample_seconds = _noise_samples(setup, g_bar, selected, sampled, inputs, runner, blocks)
    consensus = _queue_others(queued, runner, g_bar, inputs, blocks)
    step = queue_trajectory(runner, inputs.step, setup.job.loss_at, blocks, inputs.block_curvature, precision.device)
    runner.flush()
    taken = [(q, q.samples(g_bar, vectors, B, n * B)) for q in queued]
    samples = taken[0][1]
    plain, *preconditioned = (_statistics(s, setup, operator.flat.sizes, blocks, g_bar, q) for q, s in taken)
    statistics = {"loss": epoch_loss, **plain["statistics"]}
    trajectory = finish_trajectory(step, g_bar, epoch_loss, blocks, statistics, plain["blocks"])
    return {
        "statistics": statistics,
        "standard_errors": plain["standard_errors"],
        "blocks": plain["blocks"],
        "audit": audit,
        "noise_samples": plain["noise_samples"],
        "random_directions": plain["random_directions"],
        "consensus": consensus_block(consensus) if consensus else None,
        "trajectory": trajectory,
        "preconditioned": preconditioned[0] if preconditioned else None,
        "counts": _counts(samples, inputs, operator),
        "measurement_plan": plan.record(inputs.directions_per_pass),
        "timing": {
            "mean_gradient_seconds": t_mean,
            "sample_gradient_seconds": sample_seconds,
            "hvp_seconds": sum(r.hvp_seconds for r in [*(d for q in queued for d in q.measured()), *consensus]),
            "audit_seconds": audit["seconds"] if audit else 0.0,
            "total_seconds": time.perf_counter() - t0,
        },
    }
