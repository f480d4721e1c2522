"""The critical batch size three ways, from the held-out losses of branched training (no I/O).

Every batch size B of a grid was trained from one checkpoint for the same token budget E, once per
data seed; each seed reads its own sequences, the same ones at every batch size, so losses are
paired by seed. ``losses[B][seed]`` is a branch's held-out loss after the budget, and
``curves[B][seed]`` its loss at each saved point, ``[(tokens, loss), …]`` from (0, the
checkpoint's loss) to (E, the final loss).

* :func:`merrill_rule`: B* as Merrill et al. (2025) define it. Among the batches k·B_base (k ≥ 1),
  B* is the largest whose loss is within ε nats of every smaller batch's. Here a batch counts as
  within ε only when the upper bound of the confidence interval of each paired difference is.
  The interval in which the data place B* is reported too.
* :func:`fit_critical_batch`: B_crit as McCandlish et al. (2018) define it. The tokens E(B) each
  batch needs to reach a target loss, fitted by E(B) = E_min (1 + B / B_crit), with a bootstrap
  interval over the seeds.
* :func:`noise_scale_prediction`: what McCandlish's model with B_crit = B_noise predicts for
  Merrill's B* at the same ε and budget. A batch B does in E tokens what an ideal small-batch run
  does in E / (1 + B / B_noise), so its loss is the smallest branch's curve read at
  E (1 + B_0 / B_noise) / (1 + B / B_noise).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "fit_critical_batch",
    "merrill_rule",
    "noise_scale_prediction",
    "paired_difference",
    "student_t",
    "tokens_to_reach",
]

Losses = dict[int, dict[int, float]]
Curves = dict[int, dict[int, list[tuple[float, float]]]]


def student_t(confidence: float, dof: int) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``dof`` degrees of freedom (12.706
    for 95 % and 1), by bisection on its distribution function (Simpson's rule on its density)."""

    def mass(t: float) -> float:  # P(0 < T < t)
        log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
        xs = np.linspace(0.0, t, 2001)
        density = np.exp(log_c - (dof + 1) / 2 * np.log1p(xs**2 / dof))
        h = t / 2000
        return float(h / 3 * (density[0] + density[-1] + 4 * density[1:-1:2].sum() + 2 * density[2:-1:2].sum()))

    low, high = 0.0, 1.0
    while mass(high) < confidence / 2:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if mass(middle) < confidence / 2 else (low, middle)
    return (low + high) / 2


def paired_difference(larger: dict[int, float], smaller: dict[int, float], confidence: float) -> tuple[float, float]:
    """Mean and confidence half-width of ``larger − smaller`` over the seeds both have (paired);
    the half-width is infinite with fewer than two seeds (nothing bounds it)."""
    seeds = sorted(set(larger) & set(smaller))
    differences = np.array([larger[s] - smaller[s] for s in seeds], dtype=float)
    if len(differences) < 2:
        return float(differences.mean()), math.inf
    spread = differences.std(ddof=1) / math.sqrt(len(differences))
    return float(differences.mean()), float(student_t(confidence, len(differences) - 1) * spread)


def merrill_rule(losses: Losses, base: int, epsilon: float, confidence: float = 0.95) -> dict:
    """B* by Merrill et al.'s rule on the batches ``base`` × k (k ≥ 1) of the grid ``losses``.

    Returns ``cbs`` (the largest batch within ε of every smaller one, by the confidence interval's
    upper bound), ``cbs_point`` (the same by the mean differences), ``cbs_low`` and ``cbs_high``
    (B* lies in [cbs_low, cbs_high): cbs_low = cbs; cbs_high is the next batch above the largest
    that the lower bounds leave possible, None when that is the grid's top) and ``worst``: for each
    batch, the largest (mean, half-width) difference from a smaller batch.
    """
    grid = [b for b in sorted(losses) if b >= base]
    if not grid or grid[0] != base:
        raise ValueError(f"the grid {sorted(losses)} does not hold the base batch {base}")
    worst, sure, point, possible = {base: (0.0, 0.0)}, [base], [base], [base]
    for index, batch in enumerate(grid[1:], start=1):
        differences = [paired_difference(losses[batch], losses[s], confidence) for s in grid[:index]]
        worst[batch] = max(differences, key=lambda d: d[0] + d[1])
        if all(mean + half <= epsilon for mean, half in differences):
            sure.append(batch)
        if all(mean <= epsilon for mean, _ in differences):
            point.append(batch)
        if all(mean - half <= epsilon for mean, half in differences):
            possible.append(batch)
    above = [b for b in grid if b > max(possible)]
    return {
        "grid": grid,
        "cbs": max(sure),
        "cbs_point": max(point),
        "cbs_low": max(sure),
        "cbs_high": above[0] if above else None,
        "worst": worst,
    }


def tokens_to_reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The tokens at which ``curve`` ([(tokens, loss), …], tokens ascending) first reaches
    ``target``, interpolated linearly between its points; None when it never does."""
    for (t0, l0), (t1, l1) in itertools.pairwise(curve):
        if l0 <= target:
            return float(t0)
        if l1 <= target:
            return float(t0 + (t1 - t0) * (l0 - target) / (l0 - l1))
    return float(curve[-1][0]) if curve and curve[-1][1] <= target else None


def mean_curve(curves: dict[int, list[tuple[float, float]]], seeds: Sequence[int]) -> list[tuple[float, float]]:
    """The seeds' curves averaged point by point (they share their token points)."""
    first = curves[seeds[0]]
    return [(t, float(np.mean([curves[s][i][1] for s in seeds]))) for i, (t, _) in enumerate(first)]


def _fit(batches: Sequence[int], tokens: Sequence[float]) -> tuple[float, float]:
    """E_min and B_crit of E(B) = E_min + S_min B by least squares of the relative residuals
    (E spans factors); B_crit = E_min / S_min, ∞ when S_min ≤ 0, 0 when E_min ≤ 0."""
    B, E = np.asarray(batches, dtype=float), np.asarray(tokens, dtype=float)
    design = np.stack([np.ones_like(B), B], axis=1) / E[:, None]
    (e_min, s_min), *_ = np.linalg.lstsq(design, np.ones_like(E), rcond=None)
    if s_min <= 0:
        return float(e_min), math.inf
    return float(e_min), max(float(e_min / s_min), 0.0)


def fit_critical_batch(
    curves: Curves, targets: Sequence[float], resamples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> list[dict]:
    """B_crit at each target loss: the tokens E(B) each batch's mean curve needs to reach it, fitted
    by E(B) = E_min (1 + B / B_crit) over the batch sizes that reach it (``batches``; three or more,
    else no fit: ``b_crit`` None); its interval from resampling the seeds (paired across batch
    sizes) with replacement, a resample in which one of them misses the target counting as ∞."""
    grid = sorted(curves)
    seeds = sorted(set.intersection(*(set(curves[b]) for b in grid)))
    rng = np.random.default_rng(seed)
    draws = [list(rng.choice(seeds, size=len(seeds))) for _ in range(resamples)]
    fits = []
    for target in targets:
        need = {b: tokens_to_reach(mean_curve(curves[b], seeds), target) for b in grid}
        batches = [b for b in grid if need[b] is not None and need[b] > 0]
        fit = {"target": target, "batches": batches, "tokens": None, "e_min": None, "b_crit": None, "low": None}
        if len(batches) < 3:
            fits.append({**fit, "high": None})
            continue
        values = []
        for drawn in draws:
            again = [tokens_to_reach(mean_curve(curves[b], drawn), target) for b in batches]
            values.append(math.inf if any(t is None or t <= 0 for t in again) else _fit(batches, again)[1])
        tail = (1 - confidence) / 2 * 100
        low, high = (float(np.percentile(values, q, method="inverted_cdf")) for q in (tail, 100 - tail))
        e_min, b_crit = _fit(batches, [need[b] for b in batches])
        fits.append(
            {**fit, "tokens": [need[b] for b in batches], "e_min": e_min, "b_crit": b_crit, "low": low, "high": high}
        )
    return fits


def noise_scale_prediction(
    curve: Sequence[tuple[float, float]], smallest: int, base: int, b_noise: float, epsilon: float, grid: Sequence[int]
) -> dict:
    """Merrill's B* as McCandlish's model predicts it from ``b_noise``: the loss of batch B after the
    budget E is the smallest batch's mean ``curve`` read at E (1 + B_0 / B_noise) / (1 + B / B_noise)
    (B_0 = ``smallest``); B* is the largest B ≥ ``base`` whose predicted loss is within ``epsilon``
    of the base batch's (the prediction rises with B). Returns ``cbs`` (continuous, by bisection;
    ∞ when even the checkpoint's own loss is within ε) and ``cbs_grid`` (the largest such batch of
    ``grid``)."""
    budget = curve[-1][0]

    def loss(batch: float) -> float:  # B_noise = 0: the limit, E B_0 / B
        scale = (1 + smallest / b_noise) / (1 + batch / b_noise) if b_noise > 0 else smallest / batch
        return _read(curve, budget * scale)

    reference = loss(base)
    on_grid = max(b for b in grid if b >= base and loss(b) - reference <= epsilon)
    if curve[0][1] - reference <= epsilon:
        return {"cbs": math.inf, "cbs_grid": on_grid}
    low, high = float(base), float(base)
    while loss(high) - reference <= epsilon:
        low, high = high, high * 2
    for _ in range(80):
        middle = (low + high) / 2
        low, high = (middle, high) if loss(middle) - reference <= epsilon else (low, middle)
    return {"cbs": low, "cbs_grid": on_grid}


def _read(curve: Sequence[tuple[float, float]], tokens: float) -> float:
    """``curve``'s loss at ``tokens``, linear between its points (its end beyond them)."""
    xs, ys = zip(*curve, strict=True)
    return float(np.interp(tokens, xs, ys))
