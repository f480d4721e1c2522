"""The statistics of a (state, case), declared once.

Each :class:`Statistic` says how it is estimated from the records (:class:`Samples`), whether it
is a mean over sampled directions (then it has a standard error, ``<name>_se``), whether it is the
generalised Gauss–Newton part of another, and the relative error the precision audit implies for
it. Everything that lists statistics derives from :data:`STATISTICS`: :func:`summarise`,
:func:`standard_errors`, the audit's implied errors (:func:`implied_errors`), the collection's
checks and summary.csv's columns (in this order), and the documentation test. The definitions are
in :mod:`tiny_llm.curvature.noise`'s docstring.

The records they come from are :mod:`tiny_llm.curvature.records`. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tiny_llm.curvature.records import NoiseSample, RandomDirection

PREFIX = "precond_"
"""The statistics of the optimizer's coordinates u = P^{-1/2}θ: ``precond_<statistic>`` (their
summary columns and their audited errors)."""

NOISE_BATCHES = 8
"""The fewest noise batches a noise statistic is called an estimate from: a training-order window is
cut into at least this many by default; measured on fewer (the whole of a short epoch or window),
``summarize`` and the figures flag it rather than call the whole population exact."""

__all__ = [
    "NOISE_BATCHES",
    "AuditPairs",
    "STANDARD_ERRORS",
    "BLOCK_STANDARD_ERRORS",
    "BLOCK_STATISTICS",
    "STATISTICS",
    "Samples",
    "Statistic",
    "block_statistics",
    "implied_errors",
    "relative",
    "standard_errors",
    "summarise",
]


def relative(production: float, exact: float) -> float:
    """Signed relative error, finite also for an exact value of 0."""
    return (production - exact) / max(abs(exact), 2.2250738585072014e-308)  # float64's smallest normal


def _ratio(numerator: float, denominator: float) -> float | None:
    return None if denominator == 0 else numerator / denominator


@dataclass(frozen=True)
class Samples:
    """What the statistics are computed from: the sampled records and the exact whole-epoch values
    (‖ḡ‖, ḡᵀHḡ and its Gauss–Newton part), with D parameters, B sequences per effective batch and
    M sequences in the epoch."""

    noise: list[NoiseSample]
    random: list[RandomDirection]
    g_bar_norm: float
    grad_curvature: float
    D: int
    B: int
    M: int
    grad_gauss_newton: float | None = None
    vhv: list[float] = field(init=False)
    vv: list[float] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vhv", [r.curvature for r in self.noise])
        object.__setattr__(self, "vv", [r.noise_norm**2 for r in self.noise])  # ‖vᵢ‖² as saved: the norm squared

    @classmethod
    def from_result(cls, result: dict[str, Any], part: str | None = None) -> Samples:
        """The samples of a saved result (to recompute and check its statistics); ``part``: those of
        its block of that name (``preconditioned``: the statistics in the optimizer's geometry)."""
        counts = result["counts"]
        taken = result if part is None else result[part]
        statistics = taken["statistics"]
        return cls(
            [NoiseSample.from_json(r) for r in taken["noise_samples"]],
            [RandomDirection.from_json(r) for r in taken["random_directions"]],
            statistics["full_grad_norm"],
            statistics["grad_curvature"],
            counts["parameters_D"],
            counts["effective_batch_size"],
            counts["epoch_sequences"],
            statistics.get("grad_gauss_newton"),
        )

    @property
    def n(self) -> int:
        """Batches in the epoch (the population the noise batches are drawn from)."""
        return self.M // self.B

    @property
    def correction(self) -> float | None:
        """c = (M − 1)/(M − B), the finite-population correction (None for a one-batch epoch)."""
        return (self.M - 1) / (self.M - self.B) if self.M > self.B else None

    @property
    def scale(self) -> float | None:
        """B·(M − 1)/(M − B), the factor of the B estimates' standard errors."""
        return self.B * (self.M - 1) / (self.M - self.B) if self.M > self.B else None

    def mean(self, values: list[float], scale: float = 1.0) -> float | None:
        """Mean of ``values`` / scale (None when there are none or any is None)."""
        if not values or any(v is None for v in values):
            return None
        return math.fsum(values) / (len(values) * scale)


def _mean_se(values: list[float], population: int | None) -> float | None:
    """Standard error of the mean of ``values``; ``population`` (the size sampled from without
    replacement) adds the finite-population factor, None means an infinite population."""
    S = len(values)
    if S < 2 or any(v is None for v in values):
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


def _per(se: float | None, divisor: float) -> float | None:
    return None if se is None or divisor == 0 else se / divisor


# --- the audit's pairs ------------------------------------------------------------------------

Pair = tuple[float, float]


@dataclass(frozen=True)
class AuditPairs:
    """(production, float64) totals over the audited directions, from which every audited
    statistic is built twice, as the job builds it."""

    noise: Pair | None
    gradient: Pair | None
    random: Pair | None
    norms2: Pair | None
    roots: Pair | None
    grads: Pair | None
    grad_norms: Pair
    losses: Pair

    @classmethod
    def from_records(cls, records: list[dict], grad_norms: Pair, losses: Pair) -> AuditPairs:
        """The totals of an audit's direction records (kinds noise, random, gradient)."""

        def total(kind: str, pair: Callable[[dict], Any] = lambda r: (r["production"], r["float64"])) -> Pair | None:
            chosen = [pair(r) for r in records if r["kind"] == kind]
            return (math.fsum(v[0] for v in chosen), math.fsum(v[1] for v in chosen)) if chosen else None

        return cls(
            noise=total("noise"),
            gradient=total("gradient"),
            random=total("random"),
            norms2=total("noise", lambda r: r["squared_norm"]),
            roots=total("noise", lambda r: [math.sqrt(x) for x in r["squared_norm"]]),
            grads=total("noise", lambda r: r["grad_norm"]),
            grad_norms=grad_norms,
            losses=losses,
        )

    @staticmethod
    def ratio(a: Pair | None, b: Pair | None = None) -> float | None:
        """Relative error of a (or of a/b) in production against float64."""
        if a is None or (b is not None and (b[0] == 0 or b[1] == 0)):
            return None
        if b is None:
            return relative(a[0], a[1])
        return None if a[1] == 0 else relative(a[0] / b[0], a[1] / b[1])

    @property
    def g2(self) -> Pair:
        """‖ḡ‖² in both precisions."""
        return (self.grad_norms[0] ** 2, self.grad_norms[1] ** 2)

    @property
    def positive_gradient_form(self) -> bool:
        """ḡᵀHḡ > 0 in both precisions (else B_noise is null)."""
        return self.gradient is not None and self.gradient[0] > 0 and self.gradient[1] > 0


# --- the statistics ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Statistic:
    """One statistic of a result."""

    name: str
    estimate: Callable[[Samples], float | None] | None
    """Its value from the samples (None: measured over the whole epoch by the job: the loss)."""
    standard_error: Callable[[Samples], float | None] | None = None
    """Its standard error, for a mean over sampled directions (``<name>_se``); None: exact."""
    implied_error: Callable[[AuditPairs], float | None] | None = None
    """The signed relative error that the audit's pairs imply; None: not audited."""
    part_of: str | None = None
    """The statistic whose generalised Gauss–Newton part this is (quadratic-form engines)."""
    symbol: str | None = None
    """Its header in the terminal summary (``tiny-llm summarize``); None: not printed there."""

    @property
    def sampled(self) -> bool:
        """Whether it is a mean over sampled directions (with a standard error)."""
        return self.standard_error is not None

    @property
    def audited(self) -> bool:
        """Whether the precision audit reports its implied error."""
        return self.implied_error is not None


def _b_simple(s: Samples) -> float | None:
    mean_vv = s.mean(s.vv)
    return None if s.correction is None or mean_vv is None else _ratio(s.B * s.correction * mean_vv, s.g_bar_norm**2)


def _b_noise(s: Samples) -> float | None:
    mean_vhv = s.mean(s.vhv)
    if s.correction is None or mean_vhv is None or s.grad_curvature <= 0:
        return None
    return s.B * s.correction * mean_vhv / s.grad_curvature


STATISTICS: tuple[Statistic, ...] = (
    Statistic("loss", None, implied_error=lambda a: relative(*a.losses), symbol="loss"),
    Statistic(
        "noise_curvature",
        lambda s: s.mean(s.vhv),
        lambda s: _mean_se(s.vhv, s.n),
        lambda a: a.ratio(a.noise),
        symbol="vᵀHv",
    ),
    Statistic(
        "normalized_alignment",
        lambda s: _ratio(math.fsum(s.vhv), math.fsum(s.vv)),
        lambda s: _ratio_se(s.vhv, s.vv, s.n),
        lambda a: a.ratio(a.noise, a.norms2),
        symbol="align",
    ),
    Statistic(
        "mean_noise_norm",
        lambda s: s.mean([r.noise_norm for r in s.noise]),
        lambda s: _mean_se([r.noise_norm for r in s.noise], s.n),
        lambda a: a.ratio(a.roots),
    ),
    Statistic(
        "mean_grad_norm",
        lambda s: s.mean([r.grad_norm for r in s.noise]),
        lambda s: _mean_se([r.grad_norm for r in s.noise], s.n),
        lambda a: a.ratio(a.grads),
    ),
    Statistic("full_grad_norm", lambda s: s.g_bar_norm, implied_error=lambda a: relative(*a.grad_norms)),
    Statistic(
        "random_curvature",
        lambda s: s.mean([r.curvature for r in s.random], scale=s.D),
        lambda s: _per(_mean_se([r.curvature for r in s.random], None), s.D),
        lambda a: a.ratio(a.random),
        symbol="tr(H)/D",
    ),
    Statistic("grad_curvature", lambda s: s.grad_curvature, implied_error=lambda a: a.ratio(a.gradient), symbol="ḡᵀHḡ"),
    Statistic(
        "b_simple",
        _b_simple,
        lambda s: (
            None
            if s.scale is None or (se := _mean_se(s.vv, s.n)) is None or s.g_bar_norm == 0
            else s.scale * se / s.g_bar_norm**2
        ),
        lambda a: a.ratio(a.norms2, a.g2),
        symbol="B_simple",
    ),
    Statistic(
        "b_noise",
        _b_noise,
        lambda s: (
            None
            if s.scale is None or (se := _mean_se(s.vhv, s.n)) is None or s.grad_curvature <= 0
            else s.scale * se / s.grad_curvature
        ),
        lambda a: a.ratio(a.noise, a.gradient) if a.positive_gradient_form else None,
        symbol="B_noise",
    ),
    Statistic(
        "gradient_sharpness",
        lambda s: _ratio(s.grad_curvature, s.g_bar_norm**2),
        implied_error=lambda a: a.ratio(a.gradient, a.g2),
    ),
    Statistic(
        "gradient_step",
        lambda s: s.g_bar_norm**2 / s.grad_curvature if s.grad_curvature > 0 else None,
        implied_error=lambda a: a.ratio(a.g2, a.gradient) if a.positive_gradient_form else None,
    ),
    Statistic(
        "noise_gauss_newton",
        lambda s: s.mean([r.gauss_newton for r in s.noise]),
        lambda s: _mean_se([r.gauss_newton for r in s.noise], s.n),
        part_of="noise_curvature",
        symbol="vᵀGv",
    ),
    Statistic(
        "random_gauss_newton",
        lambda s: s.mean([r.gauss_newton for r in s.random], scale=s.D),
        lambda s: _per(_mean_se([r.gauss_newton for r in s.random], None), s.D),
        part_of="random_curvature",
    ),
    Statistic("grad_gauss_newton", lambda s: s.grad_gauss_newton, part_of="grad_curvature"),
)
"""Every statistic, in the order of a result's ``statistics`` block and of summary.csv."""

DECLARED: dict[str, Statistic] = {s.name: s for s in STATISTICS}
"""Every statistic by name."""
STANDARD_ERRORS: list[str] = [s.name for s in STATISTICS if s.sampled]
"""The statistics that are means over sampled directions; each has ``<name>_se``."""


BLOCK_STATISTICS = (
    "full_grad_norm",
    "mean_grad_norm",
    "mean_noise_norm",
    "b_simple",
    "gradient_share",
    "noise_share",
    "noise_curvature",
    "grad_curvature",
    "b_noise",
)
"""The statistics of each parameter block (:func:`block_statistics`), in the order of a result's
``blocks`` records and of blocks.csv; the sampled ones (BLOCK_STANDARD_ERRORS) also have
``<name>_se``. The last three are the block-diagonal forms, with the block_curvature setting."""
BLOCK_STANDARD_ERRORS = ("mean_grad_norm", "mean_noise_norm", "b_simple", "noise_curvature", "b_noise")
"""The per-block statistics that are means over the noise samples."""


def block_samples(samples: Samples, b: int, g_bar_squared: float, grad_curvature: float | None) -> Samples:
    """Parameter block b's view of the samples: each noise record's block-b parts (‖gᵢ,b‖, vᵢ,b's
    squared norm as measured and, with the block-diagonal forms, vᵢ,bᵀH_bb vᵢ,b), ‖ḡ_b‖² and
    ḡ_bᵀH_bb ḡ_b (None without the forms), so that the declared STATISTICS and their standard
    errors are the block's; no random directions."""
    noise = [
        NoiseSample(
            curvature=None if r.block_noise_curvatures is None else r.block_noise_curvatures[b],
            squared_norm=r.block_noise_squared_norms[b],
            grad_norm=math.sqrt(r.block_grad_squared_norms[b]),
        )
        for r in samples.noise
    ]
    view = Samples(noise, [], math.sqrt(g_bar_squared), grad_curvature, samples.D, samples.B, samples.M)
    object.__setattr__(view, "vv", [r.squared_norm for r in noise])  # the block's ‖vᵢ,b‖² as measured
    return view


def block_statistics(
    samples: Samples,
    names: list[str],
    parameters: list[int],
    g_bar_squared: list[float],
    grad_curvatures: list[float] | None = None,
) -> list[dict[str, Any]]:
    """Per parameter block b: the declared STATISTICS named in BLOCK_STATISTICS (with the standard
    errors of BLOCK_STANDARD_ERRORS), estimated by the same declarations on the block's view of the
    samples (:func:`block_samples`: ‖ḡ_b‖, mean ‖gᵢ,b‖ and ‖vᵢ,b‖, B_simple per block
    B·c·mean ‖vᵢ,b‖² / ‖ḡ_b‖², and with the block-diagonal forms noise_curvature, grad_curvature and
    B_noise per block B·c·mean vᵢ,bᵀH_bb vᵢ,b / ḡ_bᵀH_bb ḡ_b; null where the whole model's would be,
    and without the forms), and the block's shares ‖ḡ_b‖²/‖ḡ‖² and Σᵢ‖vᵢ,b‖²/Σᵢ‖vᵢ‖² (the squared
    block norms add up to the model's)."""
    g2_total, vv_total = math.fsum(g_bar_squared), math.fsum(samples.vv)
    rows = []
    for b, (name, count) in enumerate(zip(names, parameters, strict=True)):
        view = block_samples(samples, b, g_bar_squared[b], None if grad_curvatures is None else grad_curvatures[b])
        shares = {
            "gradient_share": _ratio(g_bar_squared[b], g2_total),
            "noise_share": _ratio(math.fsum(view.vv), vv_total),
        }
        row: dict[str, Any] = {"block": name, "parameters": count}
        for statistic in BLOCK_STATISTICS:  # the declared estimators, on the block's view
            row[statistic] = shares[statistic] if statistic in shares else DECLARED[statistic].estimate(view)
            if statistic in BLOCK_STANDARD_ERRORS:
                row[f"{statistic}_se"] = DECLARED[statistic].standard_error(view)
        rows.append(row)
    return rows


def summarise(samples: Samples) -> dict[str, float | None]:
    """The statistics estimated from the samples (all but the loss, which the job measures)."""
    return {s.name: s.estimate(samples) for s in STATISTICS if s.estimate is not None}


def standard_errors(samples: Samples) -> dict[str, float | None]:
    """``<statistic>_se`` for every sampled statistic."""
    return {f"{s.name}_se": s.standard_error(samples) for s in STATISTICS if s.sampled}


def implied_errors(pairs: AuditPairs) -> dict[str, float | None]:
    """The signed relative error of every audited statistic that the audit's pairs imply: those
    measured over the whole epoch first, then the sampled ones (the order results have kept)."""
    audited = [s for s in STATISTICS if s.audited and not s.sampled] + [
        s for s in STATISTICS if s.audited and s.sampled
    ]
    return {s.name: s.implied_error(pairs) for s in audited}
