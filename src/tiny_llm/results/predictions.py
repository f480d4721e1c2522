"""What McCandlish et al.'s model predicts for Merrill's B*, from a noise scale, with the
uncertainty the noise scale carries (no I/O).

In the model with B_crit = B_n (a noise scale: B_simple, B_noise, or their preconditioned
versions), batch B needs E_min (1 + B / B_n) tokens to reach a loss, so after a budget E it stands
where an ideal small-batch run stands after E / (1 + B / B_n). The smallest branch's mean curve
L_0(t) is itself at E_min (1 + B_0 / B_n), so the predicted loss of batch B is

    L̂(B) = L_0( E · (1 + B_0 / B_n) / (1 + B / B_n) )

and the predicted B* is the largest B ≥ B_base with L̂(B) − L̂(B_base) ≤ ε (L̂ rises with B). The
predicted B* grows with B_n, so an interval of B_n maps onto an interval of predicted B* through
its ends (:func:`prediction_interval`), and the noise scales whose prediction falls inside a
measured interval form one interval too (:func:`agreeing_scales`): a reader sees how wide a range
of noise scales would have "agreed".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["Z95", "agreeing_scales", "noise_scale_prediction", "prediction_interval"]

Z95 = 1.959964
"""The two-sided 95 % normal quantile: a noise scale's interval is its value ± Z95 standard errors."""


def _read(curve: Sequence[tuple[float, float]], tokens: float) -> float:
    """``curve``'s loss at ``tokens``, linear between its points (its end beyond them)."""
    xs, ys = zip(*curve, strict=True)
    return float(np.interp(tokens, xs, ys))


def noise_scale_prediction(
    curve: Sequence[tuple[float, float]], smallest: int, base: int, b_noise: float, epsilon: float, grid: Sequence[int]
) -> dict:
    """Merrill's B* as McCandlish's model predicts it from the noise scale ``b_noise``: the loss of
    batch B after the budget E is the smallest batch's mean ``curve`` read at E (1 + B_0 / B_n) /
    (1 + B / B_n) (B_0 = ``smallest``); B* is the largest B ≥ ``base`` whose predicted loss is
    within ``epsilon`` of the base batch's. Returns ``cbs`` (continuous, by bisection; ∞ when even
    the checkpoint's own loss is within ε) and ``cbs_grid`` (the largest such batch of ``grid``)."""
    budget = curve[-1][0]

    def loss(batch: float) -> float:  # B_n = 0: the limit, E B_0 / B
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


def prediction_interval(
    curve: Sequence[tuple[float, float]], smallest: int, base: int, scale: float, se: float | None, epsilon: float
) -> tuple[float, float] | tuple[None, None]:
    """The predicted B* at the ends of the noise scale's 95 % interval, ``scale`` ± Z95 ``se``
    (clipped at 0): the prediction's own interval (it is monotone in the scale). (None, None)
    without a standard error."""
    if se is None or not math.isfinite(se):
        return None, None
    ends = (max(scale - Z95 * se, 0.0), scale + Z95 * se)
    low, high = (noise_scale_prediction(curve, smallest, base, s, epsilon, [base])["cbs"] for s in ends)
    return low, high


def agreeing_scales(
    curve: Sequence[tuple[float, float]], smallest: int, base: int, epsilon: float, low: float, high: float | None
) -> tuple[float, float]:
    """The range of noise scales whose predicted B* (continuous) lies in the measured [``low``,
    ``high``) (``high`` None: unbounded): (smallest, largest), each by bisection on a log scale;
    0 where even B_n → 0 predicts at least ``low``, ∞ where no B_n predicts ``high``."""

    def predicted(scale: float) -> float:
        return noise_scale_prediction(curve, smallest, base, scale, epsilon, [base])["cbs"]

    def edge(bound: float) -> float:  # the least B_n whose prediction reaches ``bound``
        if predicted(0.0) >= bound:
            return 0.0
        a, b = 1e-6 * base, 1e-6 * base
        while predicted(b) < bound:
            a, b = b, b * 4
            if b > 1e12 * base:
                return math.inf
        for _ in range(60):
            middle = math.sqrt(a * b)
            a, b = (middle, b) if predicted(middle) < bound else (a, middle)
        return b

    return edge(low), (math.inf if high is None else edge(high))
