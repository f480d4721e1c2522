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

Standard errors (``standard_errors``, key ``<statistic>_se``) say how far a statistic estimated
from samples can be from its exact value for this state and case. loss, full_grad_norm and
grad_curvature are computed over the whole epoch and have none. The S_v noise batches are drawn
without replacement from the epoch's n batches, so their means carry the finite-population factor:

    se(mean of xᵢ)       = sqrt((1 − S_v/n) · s²/S_v)     (s²: sample variance, ddof 1; 0 when S_v = n)
    se(random_curvature) = sqrt(s²/S_r) / D                (Rademacher directions: no finite population)
    se(Σaᵢ/Σbᵢ)          = sqrt((1 − S_v/n) · Σ(aᵢ − R bᵢ)²/(S_v − 1) / S_v) / mean bᵢ   (delta method)
    se(b_simple)         = B·c·se(mean ‖vᵢ‖²) / ‖ḡ‖²,   se(b_noise) = B·c·se(mean vᵢᵀHvᵢ) / ḡᵀHḡ

(ḡ and ḡᵀHḡ are exact). A standard error is null when its statistic is, or with a single sample.

Precision audit (``audit``, when enabled; it runs first in the job): everything the statistics
depend on is recomputed in float64 and compared end to end with the production precision (dtype,
TF32, autocast as configured). Over the whole epoch: the loss and ḡ (so ``loss`` and
``full_grad_norm`` get their exact errors). For a seeded subset of the directions (``a`` noise
batches, ``a`` Rademacher directions, and ḡ), each precision builds the direction as the job does
(vᵢ = gᵢ − ḡ from its own batch gradient and its own ḡ) and measures its quadratic form on a seeded
sample of the curvature micro-batches (float64: the adjoint engine). Each direction records both
forms and their relative error |q − q₆₄| / |q₆₄|; each statistic records the relative error that
the audited pairs imply, the statistic built from the production values against the same built
from float64 ones (e.g. grad_curvature: ḡᵀHḡ against ḡ₆₄ᵀH₆₄ḡ₆₄; b_noise: Σvᵀ Hv / ḡᵀHḡ against
the float64 ratio; b_simple: Σ‖vᵢ‖² / ‖ḡ‖² likewise).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.memory import MemoryPlan
from tiny_llm.data.tokens import BatchPlan, TokenCache, derive_seed, group_permutation
from tiny_llm.distributed import all_reduce_sum, shard, world
from tiny_llm.model.llama import Llama
from tiny_llm.training.loop import accumulate_batch_gradient

__all__ = [
    "CaseInputs",
    "STANDARD_ERRORS",
    "batch_gradient",
    "batch_gradient_and_loss",
    "mean_gradient",
    "mean_gradient_and_loss",
    "measure_case",
    "noise_batch_indices",
    "precision_audit",
    "rademacher",
    "standard_errors",
    "summarise",
]

log = logging.getLogger(__name__)

NOISE_SAMPLE_STREAM, RADEMACHER_STREAM, AUDIT_STREAM = 2, 3, 4


def noise_batch_indices(n_batches: int, samples: int | None, seed: int) -> list[int]:
    """S_v batch indices drawn uniformly without replacement (all when ``samples`` is None or
    exceeds the epoch); a fixed function of the seed, so reused across checkpoints and cases."""
    order = group_permutation(seed, NOISE_SAMPLE_STREAM, 0, n_batches)
    count = n_batches if samples is None else min(samples, n_batches)
    return [int(i) for i in order[:count]]


def rademacher(D: int, seed: int, index: int) -> torch.Tensor:
    """Direction ``index``: D independent ±1 signs (float64, CPU), independent of batching."""
    generator = torch.Generator().manual_seed(derive_seed(seed, RADEMACHER_STREAM, index))
    return torch.randint(0, 2, (D,), generator=generator, dtype=torch.int8).double() * 2 - 1


def batch_gradient_and_loss(
    model: Llama, flat: FlatParameters, tokens: torch.Tensor, micro_batch_size: int, precision: Precision
) -> tuple[torch.Tensor, float]:
    """gᵢ of one optimizer batch (B, T+1), accumulated over training's micro-batches, as float64 (D,),
    and the batch's token-mean loss (summed over micro-batches in float64)."""
    model.zero_grad(set_to_none=True)
    loss = accumulate_batch_gradient(
        model, tokens.to(precision.device), micro_batch_size, forward=lambda x: precision.forward(model, x)
    )
    g = flat.flatten([p.grad for p in model.parameters()]).double()
    model.zero_grad(set_to_none=True)
    return g, float(loss)


def batch_gradient(
    model: Llama, flat: FlatParameters, tokens: torch.Tensor, micro_batch_size: int, precision: Precision
) -> torch.Tensor:
    """gᵢ of one optimizer batch (B, T+1), accumulated over training's micro-batches; float64 (D,)."""
    return batch_gradient_and_loss(model, flat, tokens, micro_batch_size, precision)[0]


def mean_gradient_and_loss(
    model: Llama, flat: FlatParameters, batches: list[torch.Tensor], micro_batch_size: int, precision: Precision
) -> tuple[torch.Tensor, float]:
    """ḡ = Σ_b (N_b / N) g_b over every batch of the epoch, accumulated in float64, and the epoch
    loss L = Σ_b (N_b / N) L_b, the token-mean cross-entropy over every target of the epoch."""
    n_total = sum(int(b[:, 1:].numel()) for b in batches)
    g = torch.zeros(flat.D + 1, dtype=torch.float64, device=precision.device)  # ḡ and the loss, reduced together
    for tokens in shard(batches):  # this rank's batches (all of them alone)
        g_b, loss_b = batch_gradient_and_loss(model, flat, tokens, micro_batch_size, precision)
        g[:-1] += g_b * (tokens[:, 1:].numel() / n_total)
        g[-1] += loss_b * (tokens[:, 1:].numel() / n_total)
    all_reduce_sum(g)
    return g[:-1], float(g[-1])


def mean_gradient(
    model: Llama, flat: FlatParameters, batches: list[torch.Tensor], micro_batch_size: int, precision: Precision
) -> torch.Tensor:
    """ḡ = Σ_b (N_b / N) g_b over every batch of the epoch, accumulated in float64."""
    return mean_gradient_and_loss(model, flat, batches, micro_batch_size, precision)[0]


@dataclass
class CaseInputs:
    """What one (state, case) measurement needs besides the model."""

    cache: TokenCache
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
    audit: tuple[int, int] | None = None
    """(directions of each kind, curvature micro-batches) of the precision audit, or None."""
    memory: MemoryPlan | None = None
    """Sequences per group of each pass (gradient, forms, audit, audit_gradient) under a memory budget; None:
    unchunked. Grouping changes only how the same terms are summed."""

    def rows(self, name: str) -> int | None:
        """Group rows of pass ``name`` under the memory plan (None: the engine's default)."""
        return None if self.memory is None else self.memory.rows(name)

    @property
    def gradient_micro_batch(self) -> int:
        """Sequences per backward pass of the gradients: training's micro-batch, or fewer to fit
        the memory budget (the gradient is the same sum)."""
        return self.rows("gradient") or self.micro_batch_size


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator == 0 else numerator / denominator


def _mean_of(records: list[dict], key: str, scale: float = 1.0) -> float | None:
    """Mean of ``key`` over records that all hold it (None when empty or any lacks it)."""
    if not records or any(r.get(key) is None for r in records):
        return None
    return math.fsum(r[key] for r in records) / (len(records) * scale)


def summarise(
    noise: list[dict],
    random: list[dict],
    g_bar_norm: float,
    grad_curvature: float,
    D: int,
    B: int,
    M: int,
    grad_gauss_newton: float | None = None,
) -> dict[str, float | None]:
    """The statistics block of a result from per-direction records (see module docstring)."""
    S_v, S_r = len(noise), len(random)
    vhv = math.fsum(r["noise_curvature"] for r in noise)
    vv = math.fsum(r["noise_norm"] ** 2 for r in noise)
    correction = (M - 1) / (M - B) if M > B else None
    mean_vv = vv / S_v if S_v else None
    mean_vhv = vhv / S_v if S_v else None
    return {
        "noise_curvature": mean_vhv,
        "normalized_alignment": _ratio(vhv, vv),
        "mean_noise_norm": math.fsum(r["noise_norm"] for r in noise) / S_v if S_v else None,
        "mean_grad_norm": math.fsum(r["grad_norm"] for r in noise) / S_v if S_v else None,
        "full_grad_norm": g_bar_norm,
        "random_curvature": math.fsum(r["curvature"] for r in random) / (D * S_r) if S_r else None,
        "grad_curvature": grad_curvature,
        "b_simple": None if correction is None or mean_vv is None else _ratio(B * correction * mean_vv, g_bar_norm**2),
        "b_noise": (
            None
            if correction is None or mean_vhv is None or grad_curvature <= 0
            else B * correction * mean_vhv / grad_curvature
        ),
        "noise_gauss_newton": _mean_of(noise, "noise_gauss_newton"),
        "random_gauss_newton": _mean_of(random, "gauss_newton", scale=D),
        "grad_gauss_newton": grad_gauss_newton,
    }


STANDARD_ERRORS = [
    "noise_curvature",
    "normalized_alignment",
    "mean_noise_norm",
    "mean_grad_norm",
    "random_curvature",
    "b_simple",
    "b_noise",
    "noise_gauss_newton",
    "random_gauss_newton",
]
"""The statistics that are means over sampled directions; each has ``<name>_se``."""


def _mean_se(values: list[float], population: int | None) -> float | None:
    """Standard error of the mean of ``values``; ``population`` (the size sampled from without
    replacement) adds the finite-population factor, None means an infinite population."""
    S = len(values)
    if S < 2:
        return None
    mean = math.fsum(values) / S
    variance = math.fsum((x - mean) ** 2 for x in values) / (S - 1)
    factor = 1.0 if population is None else max(0.0, 1.0 - S / population)
    return math.sqrt(factor * variance / S)


def _ratio_se(a: list[float], b: list[float], population: int) -> float | None:
    """Delta-method standard error of Σa/Σb for pairs sampled without replacement."""
    S, total_b = len(a), math.fsum(b)
    if S < 2 or total_b == 0:
        return None
    R = math.fsum(a) / total_b
    residual = math.fsum((x - R * y) ** 2 for x, y in zip(a, b, strict=True)) / (S - 1)
    return math.sqrt(max(0.0, 1.0 - S / population) * residual / S) / (total_b / S)


def standard_errors(
    noise: list[dict],
    random: list[dict],
    g_bar_norm: float,
    grad_curvature: float,
    D: int,
    B: int,
    M: int,
    grad_gauss_newton: float | None = None,
) -> dict[str, float | None]:
    """``<statistic>_se`` for every statistic in STANDARD_ERRORS (see module docstring), from the
    same per-direction records and arguments as :func:`summarise`."""
    n = M // B
    vhv = [r["noise_curvature"] for r in noise]
    vv = [r["noise_norm"] ** 2 for r in noise]
    se_vv, se_vhv = _mean_se(vv, n), _mean_se(vhv, n)
    se_random = _mean_se([r["curvature"] for r in random], None)
    scale = B * (M - 1) / (M - B) if M > B else None
    return {
        "noise_curvature_se": se_vhv,
        "normalized_alignment_se": _ratio_se(vhv, vv, n),
        "mean_noise_norm_se": _mean_se([r["noise_norm"] for r in noise], n),
        "mean_grad_norm_se": _mean_se([r["grad_norm"] for r in noise], n),
        "random_curvature_se": None if se_random is None else se_random / D,
        "b_simple_se": None if scale is None or se_vv is None or g_bar_norm == 0 else scale * se_vv / g_bar_norm**2,
        "b_noise_se": None
        if scale is None or se_vhv is None or grad_curvature <= 0
        else scale * se_vhv / grad_curvature,
        "noise_gauss_newton_se": (
            None
            if _mean_of(noise, "noise_gauss_newton") is None
            else _mean_se([r["noise_gauss_newton"] for r in noise], n)
        ),
        "random_gauss_newton_se": (
            None
            if _mean_of(random, "gauss_newton") is None
            or (se := _mean_se([r["gauss_newton"] for r in random], None)) is None
            else se / D
        ),
    }


def _consensus_block(records: list[dict]) -> dict[str, Any]:
    q = math.fsum(r["curvature"] for r in records)
    ee = math.fsum(r["squared_norm"] for r in records)
    return {
        "workers": records,
        "aggregate": {
            "mean_curvature": q / len(records),
            "normalized_alignment": _ratio(q, ee),
            "mean_norm": math.fsum(r["norm"] for r in records) / len(records),
        },
    }


GAUSS_NEWTON_KEYS = {"noise_curvature": "noise_gauss_newton", "curvature": "gauss_newton"}
"""Record key of a form -> record key of its generalised Gauss–Newton part (form engines)."""


class _DirectionRunner:
    """Feeds directions to the operator K at a time; zero directions skip the pass (curvature 0).
    With a quadratic-form engine each record also gets the form's Gauss–Newton part."""

    def __init__(self, operator: EpochHessian, precision: Precision, total: int, progress: Callable[[str], None]):
        self.operator, self.precision, self.total, self.progress = operator, precision, total, progress
        self.split = operator.spec.forms
        self.pending: list[tuple[torch.Tensor, dict, str, float]] = []
        self.done, self.started = 0, time.perf_counter()

    def add(self, vector: torch.Tensor, record: dict, key: str, started: float) -> None:
        """Queue a float64 direction; ``record[key]`` receives dᵀHd of the direction as used."""
        used = vector.to(self.precision.dtype)
        record["_norm2"] = float(used.double().pow(2).sum())
        if record["_norm2"] == 0.0:
            record[key], record["hvp_seconds"] = 0.0, 0.0
            if self.split:
                record[GAUSS_NEWTON_KEYS[key]] = 0.0
            record["total_seconds"] = time.perf_counter() - started
            self.done += 1
            return
        self.pending.append((used, record, key, started))
        if len(self.pending) == self.operator.K:
            self.flush()

    def flush(self) -> None:
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
        for i, ((_, record, key, begun), q) in enumerate(zip(self.pending, forms, strict=True)):
            record[key], record["hvp_seconds"] = q, share
            if parts is not None:
                record[GAUSS_NEWTON_KEYS[key]] = parts[i]
            record["total_seconds"] = time.perf_counter() - begun
        self.done += len(self.pending)
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        self.progress(
            f"directions {self.done}/{self.total} ({len(self.pending)} per pass over "
            f"{len(self.operator.batches)} micro-batches, {share * len(self.pending):.2f} s); "
            f"elapsed {elapsed:.1f} s, ETA {eta:.1f} s"
        )
        self.pending = []


def _audit_choice(count: int, take: int, seed: int, stream_index: int) -> list[int]:
    """``take`` of ``count`` positions, seeded (a fixed function of the seed, as the noise draw)."""
    return sorted(int(i) for i in group_permutation(seed, AUDIT_STREAM, stream_index, count)[:take]) if count else []


def _relative(production: float, exact: float) -> float:
    """Signed relative error, finite also for an exact value of 0."""
    return (production - exact) / max(abs(exact), torch.finfo(torch.float64).tiny)


def precision_audit(
    model: Llama,
    batches: list[torch.Tensor],
    g_bar: torch.Tensor,
    epoch_loss: float,
    noise_batches: list[int],
    random_indices: list[int],
    inputs: CaseInputs,
    precision: Precision,
    sampled: dict[int, tuple[torch.Tensor, float]] | None = None,
) -> dict[str, Any]:
    """End-to-end error of the production precision against float64 (module docstring).

    ``g_bar`` and ``epoch_loss`` are the job's own (production); the audit recomputes ḡ and the epoch
    loss over the whole epoch in float64, the batch gradients of the audited noise batches
    (``noise_batches``, indices into ``batches``) in both precisions, and the quadratic forms of every
    audited direction (as each precision builds it) on a seeded sample of curvature micro-batches.
    The production batch gradients and losses are left in ``sampled`` (batch index → (gᵢ, loss)),
    so the job does not compute them twice.
    """
    sampled = {} if sampled is None else sampled
    started = time.perf_counter()
    flat = FlatParameters(model)
    exact = Precision(precision.device, torch.float64)
    reference = copy.deepcopy(model).to(torch.float64)
    rows64 = inputs.rows("audit_gradient") or inputs.micro_batch_size
    g_bar64, loss64 = mean_gradient_and_loss(reference, flat, batches, rows64, exact)
    records: list[dict[str, Any]] = []
    production_vectors, exact_vectors = [], []
    for i in noise_batches:
        g = sampled.setdefault(
            i, batch_gradient_and_loss(model, flat, batches[i], inputs.gradient_micro_batch, precision)
        )[0]
        g64 = batch_gradient(reference, flat, batches[i], rows64, exact)
        v, v64 = (g - g_bar).to(precision.dtype), g64 - g_bar64
        records.append(
            {
                "kind": "noise",
                "batch_index": i,
                "grad_norm": [float(g.norm()), float(g64.norm())],
                "squared_norm": [float(v.double().pow(2).sum()), float(v64.pow(2).sum())],
            }
        )
        production_vectors.append(v)
        exact_vectors.append(v64)
    for index in random_indices:
        direction = rademacher(flat.D, inputs.seed, index).to(precision.device)
        records.append({"kind": "random", "index": index})
        production_vectors.append(direction.to(precision.dtype))
        exact_vectors.append(direction)
    records.append({"kind": "gradient"})
    production_vectors.append(g_bar.to(precision.dtype))
    exact_vectors.append(g_bar64)

    h = inputs.hvp_batch_size
    tokens = torch.cat(batches)
    micro = _audit_choice(math.ceil(tokens.shape[0] / h), inputs.audit[1], inputs.seed, 2)
    rows = torch.cat([tokens[j * h : (j + 1) * h] for j in micro])
    V, V64 = torch.stack(production_vectors), torch.stack(exact_vectors)
    production = (
        EpochHessian(
            model,
            rows,
            batch_size=h,
            engine=inputs.engine,
            precision=precision,
            directions_per_pass=len(V),
            compile=False,
            group_rows=inputs.rows("forms"),
        )
        .quadratic_forms(V)
        .tolist()
    )
    exact_engine = "double_backward" if getattr(model, "jet_refusal", None) else "adjoint"  # no rules: an HVP engine
    float64 = (
        EpochHessian(
            reference,
            rows,
            batch_size=h,
            engine=exact_engine,
            precision=exact,
            directions_per_pass=len(V),
            compile=False,
            group_rows=inputs.rows("audit"),
        )
        .quadratic_forms(V64)
        .tolist()
    )
    for record, q, q64 in zip(records, production, float64, strict=True):
        record.update(production=q, float64=q64, relative_error=abs(_relative(q, q64)))
    statistics = _implied_errors(records, (float(g_bar.norm()), float(g_bar64.norm())), (epoch_loss, loss64))
    return {
        "reference": (
            f"float64: ḡ and loss over the whole epoch, the audited batch gradients, {exact_engine}-engine forms"
        ),
        "micro_batches": micro,
        "tokens_audited": int(rows[:, 1:].numel()),
        "directions": records,
        "loss": {"production": epoch_loss, "float64": loss64},
        "full_grad_norm": {"production": float(g_bar.norm()), "float64": float(g_bar64.norm())},
        "statistics_signed_error": statistics,
        "statistics_relative_error": {k: None if v is None else abs(v) for k, v in statistics.items()},
        "max_statistic_relative_error": max((abs(v) for v in statistics.values() if v is not None), default=None),
        "max_relative_error": max(r["relative_error"] for r in records),
        "seconds": time.perf_counter() - started,
    }


def _implied_errors(
    records: list[dict], grad_norms: tuple[float, float], losses: tuple[float, float]
) -> dict[str, float | None]:
    """Signed relative error of each statistic that the audited (production, float64) pairs imply:
    every statistic built as the job builds it, once from production values and once from float64."""

    def total(
        kind: str,
        pair: Callable[[dict], Any] = lambda r: (r["production"], r["float64"]),
    ) -> tuple[float, float] | None:
        """(production, float64) sums over the audited directions of ``kind`` (None if none)."""
        chosen = [pair(r) for r in records if r["kind"] == kind]
        return (math.fsum(v[0] for v in chosen), math.fsum(v[1] for v in chosen)) if chosen else None

    def ratio(a: tuple[float, float] | None, b: tuple[float, float] | None = None) -> float | None:
        if a is None or (b is not None and (b[0] == 0 or b[1] == 0)):
            return None
        if b is None:
            return _relative(a[0], a[1])
        return None if a[1] == 0 else _relative(a[0] / b[0], a[1] / b[1])

    noise, gradient, random = total("noise"), total("gradient"), total("random")
    norms2 = total("noise", lambda r: r["squared_norm"])
    roots = total("noise", lambda r: [math.sqrt(x) for x in r["squared_norm"]])
    grads = total("noise", lambda r: r["grad_norm"])
    g2 = (grad_norms[0] ** 2, grad_norms[1] ** 2)
    positive = gradient is not None and gradient[0] > 0 and gradient[1] > 0
    return {
        "loss": _relative(*losses),
        "full_grad_norm": _relative(*grad_norms),
        "grad_curvature": ratio(gradient),
        "noise_curvature": ratio(noise),
        "normalized_alignment": ratio(noise, norms2),
        "mean_noise_norm": ratio(roots),
        "mean_grad_norm": ratio(grads),
        "random_curvature": ratio(random),
        "b_simple": ratio(norms2, g2),
        "b_noise": ratio(noise, gradient) if positive else None,
    }


def _sampled_gradients(
    selected: list[int],
    known: dict[int, tuple[torch.Tensor, float]],
    compute: Callable[[int], tuple[torch.Tensor, float]],
    D: int,
    device: torch.device,
) -> Iterator[tuple[torch.Tensor, float]]:
    """(gᵢ, loss) of the selected batches in order, ``known`` ones reused. With several ranks, each
    group of N batches is spread over the N ranks and gathered by a float64 sum (every row filled
    by one rank), so at most N gradients are held at once."""
    size = world()[1]
    if size == 1:
        for i in selected:
            yield known.pop(i, None) or compute(i)
        return
    rank = world()[0]
    for start in range(0, len(selected), size):
        group = selected[start : start + size]
        rows = torch.zeros(len(group), D + 1, dtype=torch.float64, device=device)
        if rank < len(group):
            g, loss = known.get(group[rank]) or compute(group[rank])
            rows[rank, :-1], rows[rank, -1] = g, loss
        all_reduce_sum(rows)
        for position, i in enumerate(group):
            known.pop(i, None)
            yield rows[position, :-1], float(rows[position, -1])


def measure_case(
    model: Llama, inputs: CaseInputs, precision: Precision, progress: Callable[[str], None] = log.info
) -> dict[str, Any]:
    """Every statistic of one (state, case): records, statistics, counts, timing (plain data)."""
    t0 = time.perf_counter()
    flat, plan, cache = FlatParameters(model), inputs.plan, inputs.cache
    batches = [cache.tokens(blocks) for blocks in plan.blocks]
    B, n = len(plan.blocks[0]), len(plan)
    g_bar, epoch_loss = mean_gradient_and_loss(model, flat, batches, inputs.gradient_micro_batch, precision)
    t_mean = time.perf_counter() - t0
    progress(f"mean gradient over {n} batches: {t_mean:.2f} s (epoch loss {epoch_loss:.4f})")

    selected = noise_batch_indices(n, inputs.noise_samples, inputs.seed)
    sampled: dict[int, tuple[torch.Tensor, float]] = {}  # the audit's production batch gradients, reused
    audit = None
    if inputs.audit:  # first: its memory and its verdict are known before the long part of the job
        a = inputs.audit[0]
        audited_noise = [selected[p] for p in _audit_choice(len(selected), a, inputs.seed, 0)]
        audited_random = _audit_choice(inputs.random_samples, a, inputs.seed, 1)
        progress(
            f"precision audit: ḡ and loss in float64, {len(audited_noise)} noise, {len(audited_random)} random "
            f"directions and ḡ on {inputs.audit[1]} curvature micro-batches"
        )
        audit = precision_audit(
            model, batches, g_bar, epoch_loss, audited_noise, audited_random, inputs, precision, sampled
        )
        progress(
            f"precision audit: largest implied statistic error {audit['max_statistic_relative_error']:.2e} "
            f"({audit['seconds']:.2f} s)"
        )

    epoch_tokens = torch.cat(batches)
    operator = EpochHessian(
        model,
        epoch_tokens,
        batch_size=inputs.hvp_batch_size,
        engine=inputs.engine,
        precision=precision,
        directions_per_pass=inputs.directions_per_pass,
        compile=inputs.compile,
        group_rows=inputs.rows("forms"),
    )
    total = len(selected) + inputs.random_samples + 1 + len(inputs.consensus)
    runner = _DirectionRunner(operator, precision, total, progress)
    noise, random, consensus = [], [], []
    sample_seconds = 0.0
    gradients = _sampled_gradients(
        selected,
        sampled,
        lambda i: batch_gradient_and_loss(model, flat, batches[i], inputs.gradient_micro_batch, precision),
        flat.D,
        precision.device,
    )
    for i in selected:
        started = time.perf_counter()
        g, batch_loss = next(gradients)
        sample_seconds += time.perf_counter() - started
        record = {
            "batch_index": i,
            "stream_batch": int(plan.stream_batches[i]),
            "positions": plan.positions(cache, i),
            "grad_norm": float(g.norm()),
            "loss": batch_loss,
        }
        if inputs.workers > 1:
            record["worker"] = int(plan.stream_batches[i]) % inputs.workers
        noise.append(record)
        runner.add(g - g_bar, record, "noise_curvature", started)
    for index in range(inputs.random_samples):
        record = {"index": index}
        random.append(record)
        runner.add(
            rademacher(flat.D, inputs.seed, index).to(precision.device), record, "curvature", time.perf_counter()
        )
    grad_record: dict[str, Any] = {}
    runner.add(g_bar, grad_record, "curvature", time.perf_counter())
    for worker, e in inputs.consensus:
        record = {"worker": worker}
        consensus.append(record)
        runner.add(e.to(precision.device), record, "curvature", time.perf_counter())
    runner.flush()

    for record in noise:
        record["noise_squared_norm"] = record.pop("_norm2")
        record["noise_norm"] = math.sqrt(record["noise_squared_norm"])
    for record in random:
        record.pop("_norm2")
    for record in consensus:
        record["squared_norm"] = record.pop("_norm2")
        record["norm"] = math.sqrt(record["squared_norm"])
        record["normalized_alignment"] = _ratio(record["curvature"], record["squared_norm"])
    grad_record.pop("_norm2")
    g_bar_norm = float(g_bar.norm())
    M = n * B
    arguments = (noise, random, g_bar_norm, grad_record["curvature"], flat.D, B, M, grad_record.get("gauss_newton"))
    return {
        "statistics": {"loss": epoch_loss, **summarise(*arguments)},
        "standard_errors": standard_errors(*arguments),
        "audit": audit,
        "noise_samples": noise,
        "random_directions": [
            {
                "index": r["index"],
                "curvature": r["curvature"],
                **({"gauss_newton": r["gauss_newton"]} if "gauss_newton" in r else {}),
                "hvp_seconds": r["hvp_seconds"],
            }
            for r in random
        ],
        "consensus": _consensus_block(consensus) if consensus else None,
        "counts": {
            "parameters_D": flat.D,
            "epoch_batches": n,
            "epoch_sequences": M,
            "epoch_tokens": operator.n_targets,
            "noise_samples": len(noise),
            "random_samples": len(random),
            "effective_batch_size": B,
            "micro_batch_size": inputs.micro_batch_size,
            "hvp_batch_size": inputs.hvp_batch_size,
            "hvp_batches": len(operator.batches),
            "directions_per_pass": inputs.directions_per_pass,
            "hvp_passes": operator.passes,
            "finite_epoch_correction": (M - 1) / (M - B) if M > B else None,
        },
        "timing": {
            "mean_gradient_seconds": t_mean,
            "sample_gradient_seconds": sample_seconds,
            "hvp_seconds": sum(r["hvp_seconds"] for r in noise + random + consensus) + grad_record["hvp_seconds"],
            "audit_seconds": audit["seconds"] if audit else 0.0,
            "total_seconds": time.perf_counter() - t0,
        },
    }
