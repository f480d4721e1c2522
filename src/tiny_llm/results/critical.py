"""The critical batch size three ways, from the held-out losses of branched training (no I/O).

Every batch size B of a grid was trained from one checkpoint for the same token budget E, once per
data seed; each seed reads its own sequences, the same ones at every batch size, so losses are
paired by seed. ``losses[B][seed]`` is a branch's held-out loss after the budget, and
``curves[B][seed]`` its loss at each saved point, ``[(tokens, loss), …]`` from (0, the
checkpoint's loss) to (E, the final loss).

* :func:`merrill_rule`: B* as Merrill et al. (2025) define it. Among the batches k·B_base (k ≥ 1),
  B* is the largest whose loss is within ε nats of every smaller batch's. Here a batch counts as
  within ε only when the one-sided upper confidence bound of each paired difference is, each
  bound at the level that makes all of them hold together with the stated joint confidence
  (Bonferroni over every bound the rule reads). The interval in which the data place B* is
  reported too.
* :func:`fit_critical_batch`: B_crit as McCandlish et al. (2018) define it. The tokens E(B) each
  batch needs to reach a target loss, fitted by E(B) = E_min (1 + B / B_crit) with a batch that
  misses the target within the budget as a censored observation (E(B) > E), a bootstrap interval
  over the seeds, and a flag where E(B) falls with B beyond the seeds' uncertainty (the model
  allows no such thing).
* :func:`best_rates`: each batch's best learning rate of a grid, by the seed-paired mean loss.
* :func:`seeds_needed`: how many seeds make Merrill's bounds as tight as ε asks.

:mod:`tiny_llm.results.predictions` turns the noise scales into predicted B*.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "JOINT",
    "best_rates",
    "fit_critical_batch",
    "mean_curve",
    "merrill_level",
    "merrill_rule",
    "one_sided_t",
    "paired_difference",
    "seeds_needed",
    "student_t",
    "tokens_to_reach",
]

Losses = dict[int, dict[int, float]]
Curves = dict[int, dict[int, list[tuple[float, float]]]]
JOINT = 0.95
"""The joint confidence of Merrill's interval [cbs_low, cbs_high): every bound it reads holds at once."""


@functools.lru_cache(maxsize=4096)
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


def one_sided_t(level: float, dof: int) -> float:
    """The one-sided ``level`` quantile of Student's t (2.447 for 97.5 % and 6 degrees of freedom)."""
    return student_t(2 * level - 1, dof)


def paired_difference(larger: dict[int, float], smaller: dict[int, float], level: float) -> tuple[float, float]:
    """Mean of ``larger − smaller`` over the seeds both have (paired) and the half-width of its
    one-sided ``level`` bounds (mean ± half-width); infinite with fewer than two seeds."""
    seeds = sorted(set(larger) & set(smaller))
    differences = np.array([larger[s] - smaller[s] for s in seeds], dtype=float)
    if len(differences) < 2:
        return float(differences.mean()), math.inf
    spread = differences.std(ddof=1) / math.sqrt(len(differences))
    return float(differences.mean()), float(one_sided_t(level, len(differences) - 1) * spread)


def merrill_level(batches: int, joint: float = JOINT) -> tuple[int, float]:
    """The comparisons Merrill's rule makes on ``batches`` batches (every pair) and the one-sided
    level of each of their 2 bounds (upper for cbs_low, lower for cbs_high) that makes all hold
    together with probability ``joint`` or more (Bonferroni)."""
    comparisons = batches * (batches - 1) // 2
    return comparisons, 1 - (1 - joint) / (2 * max(comparisons, 1))


def merrill_rule(losses: Losses, base: int, epsilon: float, joint: float = JOINT) -> dict:
    """B* by Merrill et al.'s rule on the batches ``base`` × k (k ≥ 1) of the grid ``losses``.

    Returns ``cbs`` (the largest batch within ε of every smaller one, by the upper bounds),
    ``cbs_point`` (the same by the mean differences), ``cbs_low`` and ``cbs_high`` (B* lies in
    [cbs_low, cbs_high) with probability ``joint``: cbs_low = cbs; cbs_high is the next batch above
    the largest that the lower bounds leave possible, None when that is the grid's top),
    ``comparisons`` and ``level`` (:func:`merrill_level`), ``spread`` (the seeds' standard
    deviation of a paired difference, pooled over the comparisons) and ``worst``: for each batch,
    the largest (mean, half-width) difference from a smaller batch.
    """
    grid = [b for b in sorted(losses) if b >= base]
    if not grid or grid[0] != base:
        raise ValueError(f"the grid {sorted(losses)} does not hold the base batch {base}")
    comparisons, level = merrill_level(len(grid), joint)
    worst, sure, point, possible, variances = {base: (0.0, 0.0)}, [base], [base], [base], []
    for index, batch in enumerate(grid[1:], start=1):
        differences = [paired_difference(losses[batch], losses[s], level) for s in grid[:index]]
        variances += [_variance(losses[batch], losses[s]) for s in grid[:index]]
        worst[batch] = max(differences, key=lambda d: d[0] + d[1])
        if all(mean + half <= epsilon for mean, half in differences):
            sure.append(batch)
        if all(mean <= epsilon for mean, _ in differences):
            point.append(batch)
        if all(mean - half <= epsilon for mean, half in differences):
            possible.append(batch)
    above = [b for b in grid if b > max(possible)]
    known = [v for v in variances if v is not None]
    return {
        "grid": grid,
        "cbs": max(sure),
        "cbs_point": max(point),
        "cbs_low": max(sure),
        "cbs_high": above[0] if above else None,
        "comparisons": comparisons,
        "level": level,
        "joint": joint,
        "epsilon": epsilon,
        "spread": math.sqrt(float(np.mean(known))) if known else None,
        "worst": worst,
    }


def _variance(larger: dict[int, float], smaller: dict[int, float]) -> float | None:
    seeds = sorted(set(larger) & set(smaller))
    if len(seeds) < 2:
        return None
    return float(np.var([larger[s] - smaller[s] for s in seeds], ddof=1))


def seeds_needed(spread: float, epsilon: float, batches: int, joint: float = JOINT, most: int = 1000) -> int | None:
    """The fewest seeds n whose Merrill bounds on ``batches`` batches have half-width at most ε / 2
    when a paired difference's standard deviation over seeds is ``spread``: t_level(n − 1) ·
    spread / √n ≤ ε / 2, so that a batch truly level with a smaller one is counted within ε unless
    its mean difference errs by more than ε / 2. None above ``most``."""
    if spread <= 0:
        return 2
    _, level = merrill_level(batches, joint)
    for n in range(2, most + 1):
        if one_sided_t(level, n - 1) * spread / math.sqrt(n) <= epsilon / 2:
            return n
    return None


def best_rates(losses: dict[int, dict[float, dict[int, float]]]) -> dict[int, tuple[float, bool]]:
    """Each batch's best learning-rate factor, ``losses[B][factor][seed]``: the lowest mean loss over
    the seeds every factor of that batch has (paired), and whether it lies at the grid's edge (the
    smallest or largest factor tried, of two or more: a better rate may lie beyond)."""
    best = {}
    for batch, by_factor in losses.items():
        seeds = sorted(set.intersection(*(set(seeds) for seeds in by_factor.values())))
        means = {f: float(np.mean([by_factor[f][s] for s in seeds])) for f in by_factor}
        means = {f: m if math.isfinite(m) else math.inf for f, m in means.items()}  # diverged: worst
        chosen = min(sorted(means), key=lambda f: means[f])
        best[batch] = (chosen, len(means) > 1 and chosen in (min(means), max(means)))
    return best


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


def _fit(batches: Sequence[int], tokens: Sequence[float | None], budget: float) -> tuple[float, float]:
    """E_min and B_crit of E(B) = E_min + S_min B, least squares on relative residuals (E spans
    factors), a batch whose ``tokens`` are None (missed within ``budget``) censored: it adds
    ((budget − Ê) / budget)² only where the line puts it below the budget (active set on a convex
    objective). B_crit = E_min / S_min, ∞ when S_min ≤ 0, 0 when E_min ≤ 0."""
    B = np.asarray(batches, dtype=float)
    seen = np.array([t is not None for t in tokens])
    E = np.array([budget if t is None else t for t in tokens], dtype=float)
    active = seen.copy()
    for _ in range(2 * len(B) + 2):
        design = np.stack([np.ones_like(B), B], axis=1)[active] / E[active, None]
        (e_min, s_min), *_ = np.linalg.lstsq(design, np.ones(int(active.sum())), rcond=None)
        below = ~seen & (e_min + s_min * B < budget * (1 - 1e-12))
        if np.array_equal(active, seen | below):
            break
        active = seen | below
    if s_min <= 0:
        return float(e_min), math.inf
    return float(e_min), max(float(e_min / s_min), 0.0)


def _violations(batches: Sequence[int], draws: list[list[float | None]], budget: float, level: float) -> list:
    """Pairs (B_j, B_k), B_j < B_k, where E(B_j) > E(B_k) in at least ``level`` of the resampled
    draws (a miss read as the budget): more tokens at the smaller batch beyond the seeds'
    uncertainty."""
    table = np.array([[budget if t is None else t for t in draw] for draw in draws], dtype=float)
    return [
        (batches[j], batches[k])
        for j, k in itertools.combinations(range(len(batches)), 2)
        if np.mean(table[:, j] > table[:, k]) >= level
    ]


def fit_critical_batch(
    curves: Curves, targets: Sequence[float], resamples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> list[dict]:
    """B_crit at each target loss: the tokens E(B) each batch's mean curve needs to reach it
    (``tokens``; None: missed within the budget, a censored observation), fitted by
    E(B) = E_min (1 + B / B_crit) over every batch of the grid (``batches``; ``censored`` those
    that missed) when two or more reach it and three or more are fitted, else no fit (``b_crit``
    None). Its interval (``low``, ``high``) from resampling the seeds (paired across batch sizes)
    with replacement; ``violations``: the pairs whose E(B) falls with B in at least ``confidence``
    of the resamples (McCandlish's model then does not describe the curves: the fit is reported
    as such)."""
    grid = sorted(curves)
    seeds = sorted(set.intersection(*(set(curves[b]) for b in grid)))
    budget = float(curves[grid[0]][seeds[0]][-1][0])
    rng = np.random.default_rng(seed)
    draws = [list(rng.choice(seeds, size=len(seeds))) for _ in range(resamples)]
    fits = []
    for target in targets:
        need = [tokens_to_reach(mean_curve(curves[b], seeds), target) for b in grid]
        reached = [b for b, t in zip(grid, need, strict=True) if t is not None]
        fit = {"target": target, "batches": grid, "tokens": need, "e_min": None, "b_crit": None}
        fit |= {"censored": [b for b in grid if b not in reached], "violations": [], "low": None, "high": None}
        if len(reached) < 2 or len(grid) < 3:
            fits.append(fit)
            continue
        again = [[tokens_to_reach(mean_curve(curves[b], drawn), target) for b in grid] for drawn in draws]
        values = [
            _fit(grid, tokens, budget)[1] if sum(t is not None for t in tokens) >= 2 else math.inf for tokens in again
        ]
        tail = (1 - confidence) / 2 * 100
        low, high = (float(np.percentile(values, q, method="inverted_cdf")) for q in (tail, 100 - tail))
        e_min, b_crit = _fit(grid, need, budget)
        fits.append(
            {**fit, "e_min": e_min, "b_crit": b_crit, "low": low, "high": high,
             "violations": _violations(grid, again, budget, confidence)}
        )  # fmt: skip
    return fits
