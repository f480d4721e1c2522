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

Precision audit (``audit``, when enabled): a seeded subset of the directions (``a`` noise, ``a``
random, and ḡ), exactly as used, is measured again on a seeded sample of the curvature
micro-batches twice: in the production precision (dtype, TF32, autocast as configured) and in
float64 (adjoint engine, exact). Each direction records both values and its relative error
|q − q₆₄| / |q₆₄|; the statistics built from quadratic forms record the relative error the
audited forms imply, Σ(q − q₆₄) / Σq₆₄ over the forms each depends on (b_noise: noise against ḡ).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.memory import MemoryPlan
from tiny_llm.data.tokens import BatchPlan, TokenCache, derive_seed, group_permutation
from tiny_llm.model.llama import Llama
from tiny_llm.training.loop import accumulate_batch_gradient

__all__ = ["CaseInputs", "STANDARD_ERRORS", "batch_gradient", "batch_gradient_and_loss", "mean_gradient",
           "mean_gradient_and_loss", "measure_case", "noise_batch_indices", "precision_audit", "rademacher",
           "standard_errors", "summarise"]

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


def batch_gradient_and_loss(model: Llama, flat: FlatParameters, tokens: torch.Tensor, micro_batch_size: int,
                            precision: Precision) -> tuple[torch.Tensor, float]:
    """gᵢ of one optimizer batch (B, T+1), accumulated over training's micro-batches, as float64 (D,),
    and the batch's token-mean loss (summed over micro-batches in float64)."""
    model.zero_grad(set_to_none=True)
    loss = accumulate_batch_gradient(model, tokens.to(precision.device), micro_batch_size,
                                     forward=lambda x: precision.forward(model, x))
    g = flat.flatten([p.grad for p in model.parameters()]).double()
    model.zero_grad(set_to_none=True)
    return g, float(loss)


def batch_gradient(model: Llama, flat: FlatParameters, tokens: torch.Tensor, micro_batch_size: int,
                   precision: Precision) -> torch.Tensor:
    """gᵢ of one optimizer batch (B, T+1), accumulated over training's micro-batches; float64 (D,)."""
    return batch_gradient_and_loss(model, flat, tokens, micro_batch_size, precision)[0]


def mean_gradient_and_loss(model: Llama, flat: FlatParameters, batches: list[torch.Tensor], micro_batch_size: int,
                           precision: Precision) -> tuple[torch.Tensor, float]:
    """ḡ = Σ_b (N_b / N) g_b over every batch of the epoch, accumulated in float64, and the epoch
    loss L = Σ_b (N_b / N) L_b, the token-mean cross-entropy over every target of the epoch."""
    n_total = sum(int(b[:, 1:].numel()) for b in batches)
    g = torch.zeros(flat.D, dtype=torch.float64, device=precision.device)
    loss = 0.0
    for tokens in batches:
        g_b, loss_b = batch_gradient_and_loss(model, flat, tokens, micro_batch_size, precision)
        g += g_b * (tokens[:, 1:].numel() / n_total)
        loss += loss_b * (tokens[:, 1:].numel() / n_total)
    return g, loss


def mean_gradient(model: Llama, flat: FlatParameters, batches: list[torch.Tensor], micro_batch_size: int,
                  precision: Precision) -> torch.Tensor:
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
    """Sequences per group of each pass (gradient, forms, audit) under a memory budget; None:
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


def summarise(noise: list[dict], random: list[dict], g_bar_norm: float, grad_curvature: float, D: int,
              B: int, M: int) -> dict[str, float | None]:
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
        "b_noise": (None if correction is None or mean_vhv is None or grad_curvature <= 0
                    else B * correction * mean_vhv / grad_curvature),
    }


STANDARD_ERRORS = ["noise_curvature", "normalized_alignment", "mean_noise_norm", "mean_grad_norm",
                   "random_curvature", "b_simple", "b_noise"]
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
    residual = math.fsum((x - R * y) ** 2 for x, y in zip(a, b)) / (S - 1)
    return math.sqrt(max(0.0, 1.0 - S / population) * residual / S) / (total_b / S)


def standard_errors(noise: list[dict], random: list[dict], g_bar_norm: float, grad_curvature: float, D: int,
                    B: int, M: int) -> dict[str, float | None]:
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
        "b_noise_se": None if scale is None or se_vhv is None or grad_curvature <= 0 else scale * se_vhv / grad_curvature,
    }


def _consensus_block(records: list[dict]) -> dict[str, Any]:
    q = math.fsum(r["curvature"] for r in records)
    ee = math.fsum(r["squared_norm"] for r in records)
    return {"workers": records, "aggregate": {
        "mean_curvature": q / len(records), "normalized_alignment": _ratio(q, ee),
        "mean_norm": math.fsum(r["norm"] for r in records) / len(records)}}


class _DirectionRunner:
    """Feeds directions to the operator K at a time; zero directions skip the pass (curvature 0)."""

    def __init__(self, operator: EpochHessian, precision: Precision, total: int, progress: Callable[[str], None]):
        self.operator, self.precision, self.total, self.progress = operator, precision, total, progress
        self.pending: list[tuple[torch.Tensor, dict, str, float]] = []
        self.done, self.started = 0, time.perf_counter()

    def add(self, vector: torch.Tensor, record: dict, key: str, started: float) -> None:
        """Queue a float64 direction; ``record[key]`` receives dᵀHd of the direction as used."""
        used = vector.to(self.precision.dtype)
        record["_norm2"] = float(used.double().pow(2).sum())
        if record["_norm2"] == 0.0:
            record[key], record["hvp_seconds"] = 0.0, 0.0
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
        forms = self.operator.quadratic_forms(torch.stack([p[0] for p in self.pending]))
        share = (time.perf_counter() - started) / len(self.pending)
        for (_, record, key, begun), q in zip(self.pending, forms.tolist()):
            record[key], record["hvp_seconds"] = q, share
            record["total_seconds"] = time.perf_counter() - begun
        self.done += len(self.pending)
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        self.progress(f"directions {self.done}/{self.total} ({len(self.pending)} per pass over "
                      f"{len(self.operator.batches)} micro-batches, {share * len(self.pending):.2f} s); "
                      f"elapsed {elapsed:.1f} s, ETA {eta:.1f} s")
        self.pending = []


def _audit_choice(count: int, take: int, seed: int, stream_index: int) -> list[int]:
    """``take`` of ``count`` positions, seeded (a fixed function of the seed, as the noise draw)."""
    return sorted(int(i) for i in group_permutation(seed, AUDIT_STREAM, stream_index, count)[:take]) if count else []


def precision_audit(model: Llama, tokens: torch.Tensor, directions: list[tuple[dict, torch.Tensor]],
                    inputs: CaseInputs, precision: Precision) -> dict[str, Any]:
    """Measure ``directions`` ((label, vector as used)) on a seeded sample of the epoch's curvature
    micro-batches, in the production precision and in float64 (module docstring)."""
    started = time.perf_counter()
    h = inputs.hvp_batch_size
    micro = _audit_choice(math.ceil(tokens.shape[0] / h), inputs.audit[1], inputs.seed, 2)
    rows = torch.cat([tokens[j * h:(j + 1) * h] for j in micro])
    V = torch.stack([vector for _, vector in directions])
    production = EpochHessian(model, rows, batch_size=h, engine=inputs.engine, precision=precision,
                              directions_per_pass=len(V), compile=False,
                              group_rows=inputs.rows("forms")).quadratic_forms(V).tolist()
    reference_model = copy.deepcopy(model).to(torch.float64)
    reference = EpochHessian(reference_model, rows, batch_size=h, engine="adjoint",
                             precision=Precision(precision.device, torch.float64), directions_per_pass=len(V),
                             compile=False, group_rows=inputs.rows("audit")).quadratic_forms(V.to(torch.float64)).tolist()
    records = []
    for (label, _), q, exact in zip(directions, production, reference):
        error = abs(q - exact) / max(abs(exact), torch.finfo(torch.float64).tiny)  # finite, also for q₆₄ = 0
        records.append({**label, "production": q, "float64": exact, "relative_error": error})

    def implied(kinds: tuple[str, ...]) -> float | None:
        chosen = [r for r in records if r["kind"] in kinds]
        total = math.fsum(r["float64"] for r in chosen)
        return None if not chosen or total == 0 else math.fsum(r["production"] - r["float64"] for r in chosen) / total

    noise, random, grad = implied(("noise",)), implied(("random",)), implied(("gradient",))
    b_noise = None if noise is None or grad is None or grad == -1 else (1 + noise) / (1 + grad) - 1
    statistics = {"noise_curvature": noise, "normalized_alignment": noise, "random_curvature": random,
                  "grad_curvature": grad, "b_noise": b_noise}
    return {"reference": "float64, adjoint engine", "micro_batches": micro,
            "tokens_audited": int(rows[:, 1:].numel()), "directions": records,
            "statistics_relative_error": {k: None if v is None else abs(v) for k, v in statistics.items()},
            "max_relative_error": max(r["relative_error"] for r in records),
            "seconds": time.perf_counter() - started}


def measure_case(model: Llama, inputs: CaseInputs, precision: Precision,
                 progress: Callable[[str], None] = log.info) -> dict[str, Any]:
    """Every statistic of one (state, case): records, statistics, counts, timing (plain data)."""
    t0 = time.perf_counter()
    flat, plan, cache = FlatParameters(model), inputs.plan, inputs.cache
    batches = [cache.tokens(blocks) for blocks in plan.blocks]
    B, n = len(plan.blocks[0]), len(plan)
    g_bar, epoch_loss = mean_gradient_and_loss(model, flat, batches, inputs.gradient_micro_batch, precision)
    t_mean = time.perf_counter() - t0
    progress(f"mean gradient over {n} batches: {t_mean:.2f} s (epoch loss {epoch_loss:.4f})")

    epoch_tokens = torch.cat(batches)
    operator = EpochHessian(model, epoch_tokens, batch_size=inputs.hvp_batch_size, engine=inputs.engine,
                            precision=precision, directions_per_pass=inputs.directions_per_pass,
                            compile=inputs.compile, group_rows=inputs.rows("forms"))
    selected = noise_batch_indices(n, inputs.noise_samples, inputs.seed)
    total = len(selected) + inputs.random_samples + 1 + len(inputs.consensus)
    runner = _DirectionRunner(operator, precision, total, progress)
    noise, random, consensus = [], [], []
    audit_directions = inputs.audit[0] if inputs.audit else 0
    audited_noise = set(_audit_choice(len(selected), audit_directions, inputs.seed, 0))
    audited_random = set(_audit_choice(inputs.random_samples, audit_directions, inputs.seed, 1))
    kept: list[tuple[dict, torch.Tensor]] = []  # (label, direction as used) of the audited directions
    sample_seconds = 0.0
    for position, i in enumerate(selected):
        started = time.perf_counter()
        g, batch_loss = batch_gradient_and_loss(model, flat, batches[i], inputs.gradient_micro_batch, precision)
        sample_seconds += time.perf_counter() - started
        record = {"batch_index": i, "stream_batch": int(plan.stream_batches[i]), "positions": plan.positions(cache, i),
                  "grad_norm": float(g.norm()), "loss": batch_loss}
        if inputs.workers > 1:
            record["worker"] = int(plan.stream_batches[i]) % inputs.workers
        noise.append(record)
        if position in audited_noise:
            kept.append(({"kind": "noise", "batch_index": i}, (g - g_bar).to(precision.dtype)))
        runner.add(g - g_bar, record, "noise_curvature", started)
    for index in range(inputs.random_samples):
        record = {"index": index}
        random.append(record)
        direction = rademacher(flat.D, inputs.seed, index).to(precision.device)
        if index in audited_random:
            kept.append(({"kind": "random", "index": index}, direction.to(precision.dtype)))
        runner.add(direction, record, "curvature", time.perf_counter())
    grad_record: dict[str, Any] = {}
    if inputs.audit:
        kept.append(({"kind": "gradient"}, g_bar.to(precision.dtype)))
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
    audit = None
    if inputs.audit:
        progress(f"precision audit: {len(kept)} directions on {inputs.audit[1]} curvature micro-batches in float64")
        audit = precision_audit(model, epoch_tokens, kept, inputs, precision)
        progress(f"precision audit: largest relative error {audit['max_relative_error']:.2e} "
                 f"({audit['seconds']:.2f} s)")
    g_bar_norm = float(g_bar.norm())
    M = n * B
    arguments = (noise, random, g_bar_norm, grad_record["curvature"], flat.D, B, M)
    return {
        "statistics": {"loss": epoch_loss, **summarise(*arguments)},
        "standard_errors": standard_errors(*arguments),
        "audit": audit,
        "noise_samples": noise,
        "random_directions": [{"index": r["index"], "curvature": r["curvature"], "hvp_seconds": r["hvp_seconds"]}
                              for r in random],
        "consensus": _consensus_block(consensus) if consensus else None,
        "counts": {"parameters_D": flat.D, "epoch_batches": n, "epoch_sequences": M,
                   "epoch_tokens": operator.n_targets, "noise_samples": len(noise),
                   "random_samples": len(random), "effective_batch_size": B,
                   "micro_batch_size": inputs.micro_batch_size, "hvp_batch_size": inputs.hvp_batch_size,
                   "hvp_batches": len(operator.batches), "directions_per_pass": inputs.directions_per_pass,
                   "hvp_passes": operator.passes, "finite_epoch_correction": (M - 1) / (M - B) if M > B else None},
        "timing": {"mean_gradient_seconds": t_mean, "sample_gradient_seconds": sample_seconds,
                   "hvp_seconds": sum(r["hvp_seconds"] for r in noise + random + consensus) + grad_record["hvp_seconds"],
                   "audit_seconds": audit["seconds"] if audit else 0.0,
                   "total_seconds": time.perf_counter() - t0},
    }
