"""The precision audit: the production precision's end-to-end error against float64.

Everything the statistics depend on is recomputed in float64 and compared with the production
precision (dtype, TF32, autocast as configured). Over the whole epoch: the loss and ḡ (so ``loss``
and ``full_grad_norm`` get their exact errors). For a seeded subset of the directions (``a`` noise
batches, ``a`` Rademacher directions, and ḡ), each precision builds the direction as the job does
(vᵢ = gᵢ − ḡ from its own batch gradient and its own ḡ) and measures its quadratic form on a seeded
sample of the curvature micro-batches (float64: the adjoint engine). Each direction records both
forms and their relative error |q − q₆₄| / |q₆₄|; each audited statistic records the relative error
that the audited pairs imply (:mod:`tiny_llm.curvature.statistics`). A job in the optimizer's
geometry as well (a preconditioner P) has the same directions audited there too, as it builds them:
in float32 a preconditioned direction carries entries up to 1/ε of the plain one's, so its forms
round differently, and its ``precond_*`` statistics get their implied errors beside the plain ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tiny_llm.curvature.case import CaseInputs
from tiny_llm.curvature.job import Job
from tiny_llm.curvature.statistics import PREFIX, AuditPairs, implied_errors, relative
from tiny_llm.curvature.vectors import Vectors
from tiny_llm.data.tokens import group_permutation

__all__ = ["AuditSide", "audit_choice", "audit_sides", "precision_audit"]

AUDIT_STREAM = 4


def audit_choice(count: int, take: int, seed: int, stream_index: int) -> list[int]:
    """``take`` of ``count`` positions, seeded (a fixed function of the seed, as the noise draw)."""
    return sorted(int(i) for i in group_permutation(seed, AUDIT_STREAM, stream_index, count)[:take]) if count else []


@dataclass
class AuditSide:
    """One precision of the audit (the production's or float64): its job (whose batch gradients gᵢ
    and ḡ it takes, and whose operator gives its quadratic forms of K directions over given token
    rows), how it holds vectors (whole, or this rank's shard), and the forms' engine for K
    directions."""

    job: Job
    vectors: Vectors
    engine: Callable[[int], str]

    @property
    def dtype(self) -> torch.dtype:
        return self.job.precision.dtype

    @property
    def device(self) -> torch.device:
        return self.job.precision.device

    def batch_gradient(self, i: int) -> tuple[torch.Tensor, float]:
        return self.job.batch_gradient_and_loss(i)

    def mean_gradient(self) -> tuple[torch.Tensor, float]:
        return self.job.mean_gradient_and_loss()

    def forms(self, V: torch.Tensor, tokens: torch.Tensor) -> list[float]:
        """vᵀHv of the rows of V over ``tokens``, all directions in one pass."""
        return self.job.operator(self.engine(len(V)), tokens, len(V)).quadratic_forms(V).tolist()


def audit_sides(job: Job, inputs: CaseInputs) -> tuple[AuditSide, AuditSide]:
    """The production side (the job itself) and the float64 side (the same job on the model's
    float64 copy, ``Job.reference``, placed the same way, cut as the memory plan's audit passes, its
    forms by the engine ``auto`` gives the model under the placement)."""

    def side(of: Job, engine: Callable[[int], str]) -> AuditSide:
        return AuditSide(of, of.placement.vectors(inputs.seed), engine)

    production = side(job, lambda K: inputs.engine)
    reference = job.reference()  # float64: exact forms, or an HVP's without rules
    float64 = side(reference, reference.placement.forms_engine)
    return production, float64


Pair = tuple[torch.Tensor, torch.Tensor]


def _batch_gradients(
    sides: tuple[AuditSide, AuditSide], noise_batches: list[int], sampled: dict[int, tuple[torch.Tensor, float]]
) -> list[Pair]:
    """(gᵢ, gᵢ in float64) of the audited noise batches, each precision's own; the production
    batch gradients are left in ``sampled``."""
    production, exact = sides
    return [(sampled.setdefault(i, production.batch_gradient(i))[0], exact.batch_gradient(i)[0]) for i in noise_batches]


def _directions(
    sides: tuple[AuditSide, AuditSide],
    g_bars: Pair,
    gradients: list[Pair],
    audited: tuple[list[int], list[int]],
    scale: torch.Tensor | None = None,
) -> tuple[list[dict[str, Any]], torch.Tensor, torch.Tensor]:
    """The audited directions of one geometry as each precision builds them (production, float64),
    with a record of each: noise directions from each one's own batch gradient and ḡ, Rademacher
    directions, and ḡ. With ``scale`` s (float64, held as every vector), in the optimizer's
    coordinates u of θ = diag(s) u exactly as the job builds them (:meth:`DirectionRunner.add`):
    d_u in float64, cast to the production dtype, then multiplied by s in that dtype, so a form of
    (s ⊙ d_u) is audited; float64 builds the same from its own gradients."""
    (production, exact), (g_bar, g_bar64), (noise_batches, random_indices) = sides, g_bars, audited
    s = torch.ones((), dtype=torch.float64, device=g_bar.device) if scale is None else scale
    s_used = s.to(production.dtype)
    records: list[dict[str, Any]] = []
    production_vectors, exact_vectors = [], []

    def add(record: dict[str, Any], d_u: torch.Tensor, d_u64: torch.Tensor) -> None:
        used = d_u.to(production.dtype)
        if record["kind"] == "noise":
            record["squared_norm"] = [production.vectors.squared_norm(used), exact.vectors.squared_norm(d_u64)]
        records.append(record if scale is None else {**record, "geometry": "preconditioned"})
        production_vectors.append(used if scale is None else used * s_used)
        exact_vectors.append(d_u64 if scale is None else d_u64 * s)

    for i, (g, g64) in zip(noise_batches, gradients, strict=True):
        norms = [production.vectors.norm(g * s), exact.vectors.norm(g64 * s)]
        add({"kind": "noise", "batch_index": i, "grad_norm": norms}, (g - g_bar) * s, (g64 - g_bar64) * s)
    for index in random_indices:
        direction = production.vectors.rademacher(index).to(production.device)
        add({"kind": "random", "index": index}, direction, direction)
    add({"kind": "gradient"}, g_bar * s, g_bar64 * s)
    return records, torch.stack(production_vectors), torch.stack(exact_vectors)


def _implied(
    records: list[list[dict[str, Any]]], sides: tuple[AuditSide, AuditSide], g_bars: Pair, losses: tuple, scales: list
) -> dict[str, float | None]:
    """The signed error each audited statistic implies, from each geometry's records and scale: the
    plain ones (None), and with s = P^{1/2} the ``precond_`` ones (ḡ_u = s ⊙ ḡ; the loss is the same)."""
    (production, exact), (g_bar, g_bar64), statistics = sides, g_bars, {}
    for taken, s, prefix in zip(records, scales, ("", PREFIX)[: len(scales)], strict=True):
        u, u64 = (g_bar, g_bar64) if s is None else (g_bar * s, g_bar64 * s)
        norms = (production.vectors.norm(u), exact.vectors.norm(u64))
        implied = implied_errors(AuditPairs.from_records(taken, norms, losses))
        statistics |= {prefix + name: value for name, value in implied.items() if not (prefix and name == "loss")}
    return statistics


def precision_audit(
    sides: tuple[AuditSide, AuditSide],
    mean: tuple[torch.Tensor, float],
    audited: tuple[list[int], list[int]],
    inputs: CaseInputs,
    sampled: dict[int, tuple[torch.Tensor, float]] | None = None,
    scale: torch.Tensor | None = None,
) -> dict[str, Any]:
    """End-to-end error of the production precision against float64 (module docstring), in every
    geometry the job measures.

    ``sides`` are the production and float64 precisions (:func:`audit_sides`); ``mean`` is the
    job's own (production) ḡ and epoch loss; ``audited`` the audited noise batches (indices into
    the job's batches) and Rademacher directions. The audit recomputes ḡ and the epoch loss over the
    whole epoch in float64, the batch gradients of the audited noise batches in both precisions,
    and the quadratic forms of every audited direction (as each precision builds it) on a seeded
    sample of curvature micro-batches, all in one pass. With ``scale`` s = P^{1/2} (the job's
    preconditioner) the same directions are audited again in the optimizer's coordinates: their
    records say ``"geometry": "preconditioned"`` and their implied errors are the ``precond_``
    statistics'. The production batch gradients and losses are left in ``sampled`` (batch index →
    (gᵢ, loss)), so the job does not compute them twice.
    """
    sampled = {} if sampled is None else sampled
    started = time.perf_counter()
    (production, exact), (g_bar, epoch_loss) = sides, mean
    g_bar64, loss64 = exact.mean_gradient()
    gradients = _batch_gradients(sides, audited[0], sampled)
    scales = [None] if scale is None else [None, scale.to(g_bar.device)]  # the plain geometry, and P's
    geometries = [_directions(sides, (g_bar, g_bar64), gradients, audited, s) for s in scales]
    h = inputs.hvp_batch_size
    tokens = torch.cat(production.job.batches)
    micro = audit_choice(math.ceil(tokens.shape[0] / h), inputs.audit[1], inputs.seed, 2)
    rows = torch.cat([tokens[j * h : (j + 1) * h] for j in micro])
    production_forms = production.forms(torch.cat([V for _, V, _ in geometries]), rows)
    float64 = exact.forms(torch.cat([V64 for *_, V64 in geometries]), rows)
    exact_engine = exact.engine(sum(len(V64) for *_, V64 in geometries))
    records = [r for taken, _, _ in geometries for r in taken]
    for record, q, q64 in zip(records, production_forms, float64, strict=True):
        record.update(production=q, float64=q64, relative_error=abs(relative(q, q64)))
    norms = (production.vectors.norm(g_bar), exact.vectors.norm(g_bar64))
    losses = (epoch_loss, loss64)  # the same in both geometries
    statistics = _implied([taken for taken, _, _ in geometries], sides, (g_bar, g_bar64), losses, scales)
    return {
        "reference": (
            f"float64: ḡ and loss over the whole epoch, the audited batch gradients, {exact_engine}-engine forms"
        ),
        "micro_batches": micro,
        "tokens_audited": int(rows[:, 1:].numel()),
        "geometries": ["plain"] + (["preconditioned"] if scale is not None else []),
        "directions": records,
        "loss": {"production": epoch_loss, "float64": loss64},
        "full_grad_norm": {"production": norms[0], "float64": norms[1]},
        "statistics_signed_error": statistics,
        "statistics_relative_error": {k: None if v is None else abs(v) for k, v in statistics.items()},
        "max_statistic_relative_error": max((abs(v) for v in statistics.values() if v is not None), default=None),
        "max_relative_error": max(r["relative_error"] for r in records),
        "seconds": time.perf_counter() - started,
    }
