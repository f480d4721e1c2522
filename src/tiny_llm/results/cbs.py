"""The critical batch size of branched training, three ways, beside the noise scales.

For each checkpoint of a critical-batch-size experiment, every batch size B of the grid was trained
on from the checkpoint for the same token budget, once per data seed, and its loss measured on
held-out data at every quarter of the budget (:func:`tiny_llm.training.branches.measure_branches`).
From those records (:mod:`tiny_llm.results.critical` has the formulas):

* ``cbs.csv``, one row per checkpoint:
  * B* by Merrill et al.'s rule, with the interval the data leave it;
  * B_crit fitted as McCandlish et al. define it, with its bootstrap interval;
  * the B* that B_noise predicts through McCandlish's model;
  * B_simple and B_noise from the experiment's analysis at the same checkpoint;
  * the older relative rule (within (1 + ε) × the best loss), under its own name.
  Sizes are in sequences, and the main ones in tokens too.
* ``branches.csv``: one row per checkpoint and batch size.
* ``fits.csv``: the fit at each target loss.
* ``curves.csv``: every branch's held-out loss at each point.
* ``lr_check.csv``: where the experiment asks for it, each batch size at multiples of the rule's
  learning rate (the branches at the rule's own rate alone give the three answers).
* :func:`draw_cbs`: the figure.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tiny_llm.results.critical import (
    fit_critical_batch,
    mean_curve,
    merrill_rule,
    noise_scale_prediction,
    paired_difference,
)

__all__ = [
    "BRANCH_COLUMNS",
    "CBS_COLUMNS",
    "CURVE_COLUMNS",
    "FIT_COLUMNS",
    "LR_COLUMNS",
    "TARGETS",
    "cbs_tables",
    "lr_check_rows",
    "relative_rule",
]

TARGETS = (0.25, 0.5, 0.75)
"""Target losses of the B_crit fit, as fractions of the drop from the checkpoint's loss to the
lowest final mean loss of any batch size; each is fitted over the batch sizes that reach it. The
headline fit (``cbs.csv``) is at the middle one."""
SCALES = ("b_simple", "b_noise", "precond_b_simple", "precond_b_noise")
"""The noise scales beside the answers: plain, and in the optimizer's geometry (blank without it)."""
SIZES = ("cbs", "cbs_high", "b_crit", "b_crit_low", "b_crit_high", "b_noise_cbs", *SCALES)
"""The sizes that ``cbs.csv`` also gives in tokens (``<name>_tokens``)."""
CBS_COLUMNS = [
    "checkpoint",
    "step",
    "tokens",
    "start_loss",
    "base_batch",
    "cbs",
    "cbs_point",
    "cbs_low",
    "cbs_high",
    "b_crit",
    "b_crit_low",
    "b_crit_high",
    "b_crit_target",
    "b_noise_cbs",
    "b_noise_cbs_grid",
    "case",
    *(f"{name}{suffix}" for name in SCALES for suffix in ("", "_se")),
    "relative_cbs",
    *(f"{name}_tokens" for name in SIZES),
]
"""``cbs.csv``: ``cbs_high`` blank when the data cannot bound B* from above within the grid;
``b_crit*`` blank when fewer than three batch sizes reach the middle target, ``inf`` when the
tokens needed do not grow with the batch."""
COMPARED = ["lr", "seeds", "loss", "loss_se", "difference", "difference_half_width"]
"""The columns that ``branches.csv`` and ``lr_check.csv`` share: a rate's mean held-out loss over the
seeds and its paired difference from a reference."""
BRANCH_COLUMNS = ["checkpoint", "batch_size", "batch_tokens", "steps", *COMPARED, "within"]
"""``branches.csv``: the mean held-out loss of each batch size over its seeds and its standard
error; for the batches from the base batch up, the largest paired difference from a smaller one
with its confidence half-width, and whether its upper bound is within ε."""
FIT_COLUMNS = [
    "checkpoint",
    "target_loss",
    "batch_sizes",
    "tokens_needed",
    "e_min",
    "b_crit",
    "b_crit_low",
    "b_crit_high",
]
"""``fits.csv``: the batch sizes that reach the target and the tokens E(B) each needs."""
CURVE_COLUMNS = ["checkpoint", "batch_size", "seed", "tokens", "loss"]
LR_COLUMNS = ["checkpoint", "batch_size", "lr_factor", *COMPARED, "best"]
"""``lr_check.csv``: each batch size at each multiple of the rule's rate, its paired difference from
the rule's rate (× 1; positive: worse), and whether it is the best of them by the mean."""


def relative_rule(means: dict[int, float], epsilon: float) -> int:
    """The largest batch whose mean loss is within (1 + ε) × the best of the grid (this project's
    earlier rule; not Merrill et al.'s)."""
    best = min(means.values())
    return max(b for b, m in means.items() if m <= (1 + epsilon) * best)


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    mean = float(np.mean(values))
    return mean, (float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None)


def _noise_scales(summary: Any, checkpoint: str, case: str) -> dict[str, float | None]:
    row = summary[(summary["file"] == f"{checkpoint}.safetensors") & (summary["case"] == case)]
    names = [f"{name}{suffix}" for name in SCALES for suffix in ("", "_se")]
    if row.empty:
        return dict.fromkeys(names)
    values = {name: row.iloc[0].get(name) for name in names}  # an older summary has no precond_* columns
    return {
        name: None if value is None or value != value or value == "" else float(value) for name, value in values.items()
    }


def _targets(record: dict[str, Any], means: dict[int, float]) -> list[float]:
    start, best = record["start_loss"], min(means.values())
    return [start - f * (start - best) for f in TARGETS] if best < start else []


def checkpoint_rows(record: dict[str, Any], scales: dict[str, float | None], epsilon: float, base: int) -> dict:
    """One checkpoint's answers: its ``cbs.csv`` row (sizes in sequences), branch rows and fits."""
    losses: dict[int, dict[int, float]] = {}
    curves: dict[int, dict[int, list[tuple[float, float]]]] = {}
    record = {**record, "branches": [b for b in record["branches"] if b.get("lr_factor", 1) == 1]}
    for branch in record["branches"]:
        losses.setdefault(branch["batch_size"], {})[branch["seed"]] = branch["loss"]
        curves.setdefault(branch["batch_size"], {})[branch["seed"]] = [tuple(p) for p in branch["curve"]]
    grid = sorted(losses)
    stats = {b: _mean_se(list(losses[b].values())) for b in grid}
    means = {b: stats[b][0] for b in grid}
    merrill = merrill_rule(losses, base, epsilon)
    fits = fit_critical_batch(curves, _targets(record, means))
    headline = fits[len(TARGETS) // 2] if fits and fits[len(TARGETS) // 2]["b_crit"] is not None else None
    predicted = {"cbs": None, "cbs_grid": None}
    if scales["b_noise"] is not None:
        smallest = mean_curve(curves[grid[0]], sorted(curves[grid[0]]))
        predicted = noise_scale_prediction(smallest, grid[0], base, scales["b_noise"], epsilon, grid)
    row = {
        **{k: record[k] for k in ("checkpoint", "step", "tokens", "start_loss")},
        "base_batch": base,
        **{k: merrill[k] for k in ("cbs", "cbs_point", "cbs_low", "cbs_high")},
        "b_crit": headline and headline["b_crit"],
        "b_crit_low": headline and headline["low"],
        "b_crit_high": headline and headline["high"],
        "b_crit_target": headline and headline["target"],
        "b_noise_cbs": predicted["cbs"],
        "b_noise_cbs_grid": predicted["cbs_grid"],
        **scales,
        "relative_cbs": relative_rule(means, epsilon),
    }
    branches = []
    for batch in grid:
        first = next(b for b in record["branches"] if b["batch_size"] == batch)
        worst = merrill["worst"].get(batch)
        branches.append(
            {
                "checkpoint": record["checkpoint"], "batch_size": batch, "steps": first["steps"], "lr": first["lr"],
                "seeds": len(losses[batch]), "loss": stats[batch][0], "loss_se": stats[batch][1],
                "difference": worst and worst[0], "difference_half_width": worst and worst[1],
                "within": None if worst is None else worst[0] + worst[1] <= epsilon,
            }
        )  # fmt: skip
    return {"row": row, "branches": branches, "fits": fits, "curves": curves}


def lr_check_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The learning-rate check of one checkpoint (empty where its branches have one rate each)."""
    losses: dict[tuple[int, float], dict[int, float]] = {}
    rates: dict[tuple[int, float], float] = {}
    for branch in record["branches"]:
        key = (branch["batch_size"], float(branch.get("lr_factor", 1)))
        losses.setdefault(key, {})[branch["seed"]] = branch["loss"]
        rates[key] = branch["lr"]
    if {factor for _, factor in losses} == {1.0}:
        return []
    rows = []
    for batch in sorted({b for b, _ in losses}):
        factors = sorted(f for b, f in losses if b == batch)
        stats = {f: _mean_se(list(losses[(batch, f)].values())) for f in factors}
        best = min(factors, key=lambda f: stats[f][0])
        for factor in factors:
            difference, half = paired_difference(losses[(batch, factor)], losses[(batch, 1.0)], 0.95)
            rows.append(
                {
                    "checkpoint": record["checkpoint"], "batch_size": batch, "lr_factor": factor,
                    "lr": rates[(batch, factor)], "seeds": len(losses[(batch, factor)]), "loss": stats[factor][0],
                    "loss_se": stats[factor][1], "difference": difference,
                    "difference_half_width": None if math.isinf(half) else half, "best": factor == best,
                }
            )  # fmt: skip
    return rows


def cbs_tables(
    records: list[dict[str, Any]], summary: Any, case: str, epsilon: float, seq_len: int, base: int
) -> dict[str, list[dict[str, Any]]]:
    """The rows of ``cbs.csv``, ``branches.csv``, ``fits.csv``, ``curves.csv`` and ``lr_check.csv`` from the branch
    records (:func:`~tiny_llm.training.branches.measure_branches`) and the analysis's summary rows
    of ``case``; ``base`` is the base run's batch size."""
    tables: dict[str, list[dict[str, Any]]] = {"cbs": [], "branches": [], "fits": [], "curves": [], "lr_check": []}
    for record in sorted(records, key=lambda r: r["step"]):
        found = checkpoint_rows(record, _noise_scales(summary, record["checkpoint"], case), epsilon, base)
        row = {**found["row"], "case": case}
        row.update({f"{n}_tokens": None if row[n] is None else row[n] * seq_len for n in SIZES})
        tables["cbs"].append(row)
        tables["branches"] += [{**b, "batch_tokens": b["batch_size"] * seq_len} for b in found["branches"]]
        tables["lr_check"] += lr_check_rows(record)
        for fit in found["fits"]:
            tables["fits"].append(
                {
                    "checkpoint": record["checkpoint"], "target_loss": fit["target"], "e_min": fit["e_min"],
                    "b_crit": fit["b_crit"], "b_crit_low": fit["low"], "b_crit_high": fit["high"],
                    "batch_sizes": " ".join(map(str, fit["batches"])),
                    "tokens_needed": " ".join(f"{t:.6g}" for t in fit["tokens"] or []),
                }
            )  # fmt: skip
        for batch, seeds in found["curves"].items():
            for seed, curve in seeds.items():
                tables["curves"] += [
                    {"checkpoint": record["checkpoint"], "batch_size": batch, "seed": seed, "tokens": t, "loss": loss}
                    for t, loss in curve
                ]
    columns = {
        "cbs": CBS_COLUMNS, "branches": BRANCH_COLUMNS, "fits": FIT_COLUMNS, "curves": CURVE_COLUMNS,
        "lr_check": LR_COLUMNS,
    }  # fmt: skip
    return {name: [{k: _cell(r.get(k)) for k in columns[name]} for r in rows] for name, rows in tables.items()}


def _cell(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
