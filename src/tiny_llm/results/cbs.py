"""The critical batch size of branched training, three ways, beside the noise scales.

For each checkpoint of a critical-batch-size experiment, every batch size B of the grid was trained
on from the checkpoint for the same token budget, once per data seed and learning rate of the grid
(multiples of the rule's rate), and its loss measured on held-out data at every quarter of the
budget (:func:`tiny_llm.training.branches.measure_branches`). Every answer is given twice: at each
batch's best rate of the grid (``rates`` = ``tuned``, where the grid has more than one rate) and at
the rule's rate (``rule``). From those records (:mod:`tiny_llm.results.critical` and
:mod:`tiny_llm.results.predictions` have the formulas):

* ``cbs.csv``, one row per checkpoint and rates:
  * B* by Merrill et al.'s rule, with the interval the data leave it at a stated joint confidence,
    the seeds' paired spread and the seeds that ε needs at that spread;
  * B_crit fitted as McCandlish et al. define it, with its bootstrap interval, the batches that
    missed the target (censored) and a flag where the tokens needed fall with the batch;
  * the B* that each noise scale predicts through McCandlish's model, with its interval from the
    scale's standard error, and the range of noise scales whose prediction lies in B*'s interval;
  * B_simple and B_noise (and B_simple,P, B_noise,P) from the experiment's analysis;
  * the older relative rule (within (1 + ε) × the best loss), under its own name.
  Sizes are in sequences, and the main ones in tokens too.
* ``branches.csv``: one row per checkpoint, rates and batch size (the branches the answers read).
* ``rates.csv``: every (checkpoint, batch size, learning rate) the experiment trained.
* ``fits.csv``: the fit at each target loss.
* ``curves.csv``: every branch's held-out loss at each point.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tiny_llm.results.critical import (
    best_rates,
    fit_critical_batch,
    mean_curve,
    merrill_rule,
    paired_difference,
    seeds_needed,
)
from tiny_llm.results.predictions import agreeing_scales, noise_scale_prediction, prediction_interval

__all__ = [
    "BRANCH_COLUMNS",
    "CBS_COLUMNS",
    "COLUMNS",
    "CURVE_COLUMNS",
    "FIT_COLUMNS",
    "RATE_COLUMNS",
    "TARGETS",
    "cbs_tables",
    "checkpoint_rows",
    "rate_rows",
    "relative_rule",
]

TARGETS = (0.25, 0.5, 0.75)
"""Target losses of the B_crit fit, as fractions of the drop from the checkpoint's loss to the
lowest final mean loss of any batch size; the headline fit (``cbs.csv``) is at the middle one."""
SCALES = ("b_simple", "b_noise", "precond_b_simple", "precond_b_noise")
"""The noise scales beside the answers: plain, and in the optimizer's geometry (blank without it)."""
PREDICTED = tuple(f"{name}_cbs" for name in SCALES)
"""The B* each noise scale predicts (``<scale>_cbs``, with ``_low``, ``_high``, ``_grid``, ``_agrees``)."""
SIZES = ("cbs", "cbs_high", "b_crit", "b_crit_low", "b_crit_high", *PREDICTED, *SCALES)
"""The sizes that ``cbs.csv`` also gives in tokens (``<name>_tokens``)."""
CBS_COLUMNS = [
    "checkpoint", "step", "tokens", "start_loss", "base_batch", "rates", "lr_edge",
    "cbs", "cbs_point", "cbs_low", "cbs_high", "cbs_level", "cbs_joint", "cbs_comparisons",
    "seeds", "paired_spread", "seeds_needed", "agreeing_scale_low", "agreeing_scale_high",
    "b_crit", "b_crit_low", "b_crit_high", "b_crit_target", "b_crit_censored", "b_crit_violations",
    *(f"{name}{suffix}" for name in PREDICTED for suffix in ("", "_low", "_high", "_grid", "_agrees")),
    "case", *(f"{name}{suffix}" for name in SCALES for suffix in ("", "_se")),
    "relative_cbs", *(f"{name}_tokens" for name in SIZES),
]  # fmt: skip
"""``cbs.csv``: ``cbs_high`` blank when the data cannot bound B* from above within the grid;
``b_crit*`` blank when fewer than two batch sizes reach the middle target, ``inf`` when the
tokens needed do not grow with the batch; a prediction blank where its noise scale is."""
MEMORY = ["lr", "steps", "beta1", "beta2", "memory_steps", "memory_tokens"]
"""What a branch trains with: its rate, steps, Adam's β's and the second moment's memory −1/ln β2
(its e-folding time) in steps and tokens (blank for SGD)."""
COMPARED = ["seeds", "loss", "loss_se", "difference", "difference_half_width"]
BRANCH_COLUMNS = ["checkpoint", "rates", "batch_size", "batch_tokens", "lr_factor", "lr_edge", *MEMORY, *COMPARED]
BRANCH_COLUMNS += ["within"]
"""``branches.csv``: the branches an answer reads (``rates`` tuned or rule): each batch's mean
held-out loss over its seeds and its standard error; for the batches from the base batch up, the
largest paired difference from a smaller one with the half-width of its bound at Merrill's level,
and whether its upper bound is within ε."""
RATE_COLUMNS = ["checkpoint", "batch_size", "batch_tokens", "lr_factor", *MEMORY, *COMPARED, "best", "lr_edge"]
"""``rates.csv``: every rate of the grid at every batch, its paired difference from the rule's rate
(positive: worse; half-width of a 95 % two-sided interval) and whether it is the batch's best."""
FIT_COLUMNS = ["checkpoint", "rates", "target_loss", "batch_sizes", "tokens_needed", "censored", "violations"]
FIT_COLUMNS += ["e_min", "b_crit", "b_crit_low", "b_crit_high"]
"""``fits.csv``: E(B) at each batch (``>E`` where it missed the target within the budget E: censored)."""
CURVE_COLUMNS = ["checkpoint", "batch_size", "lr_factor", "seed", "tokens", "loss"]
COLUMNS = {"cbs": CBS_COLUMNS, "branches": BRANCH_COLUMNS, "rates": RATE_COLUMNS, "fits": FIT_COLUMNS}
COLUMNS["curves"] = CURVE_COLUMNS
"""Each table's columns, in order."""


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


def _memory(branch: dict[str, Any], seq_len: int) -> dict[str, Any]:
    beta2 = branch.get("beta2")
    steps = None if beta2 is None else -1 / math.log(beta2)
    tokens = None if steps is None else steps * branch["batch_size"] * seq_len
    return {k: branch.get(k) for k in ("lr", "steps", "beta1", "beta2")} | {
        "memory_steps": steps,
        "memory_tokens": tokens,
    }


def _predictions(curve, smallest, base, scales, epsilon, grid, measured) -> dict[str, Any]:
    """Each noise scale's predicted B* (continuous, on the grid, its interval) and whether that
    interval meets the measured [cbs_low, cbs_high)."""
    row: dict[str, Any] = {}
    low, high = measured["cbs_low"], measured["cbs_high"]
    for name in SCALES:
        scale, se = scales.get(name), scales.get(f"{name}_se")
        found = {"cbs": None, "cbs_grid": None}
        ends: tuple = (None, None)
        if scale is not None:
            found = noise_scale_prediction(curve, smallest, base, scale, epsilon, grid)
            ends = prediction_interval(curve, smallest, base, scale, se, epsilon)
        span = (found["cbs"], found["cbs"]) if ends[0] is None else ends
        agrees = None if span[0] is None else span[1] >= low and (high is None or span[0] < high)
        row |= {f"{name}_cbs": found["cbs"], f"{name}_cbs_low": ends[0], f"{name}_cbs_high": ends[1]}
        row |= {f"{name}_cbs_grid": found["cbs_grid"], f"{name}_cbs_agrees": agrees}
    return row


def _answers(chosen: dict[int, dict[int, dict]], record: dict, scales: dict, epsilon: float, base: int) -> dict:
    """The answers from one branch per (batch, seed) (``chosen[B][seed]``): the cbs.csv row's
    answer columns, Merrill's result and the fits."""
    losses = {b: {s: branch["loss"] for s, branch in seeds.items()} for b, seeds in chosen.items()}
    curves = {b: {s: [tuple(p) for p in branch["curve"]] for s, branch in seeds.items()} for b, seeds in chosen.items()}
    grid = sorted(losses)
    means = {b: float(np.mean(list(losses[b].values()))) for b in grid}
    merrill = merrill_rule(losses, base, epsilon)
    start, best = record["start_loss"], min(means.values())
    fits = fit_critical_batch(curves, [start - f * (start - best) for f in TARGETS] if best < start else [])
    headline = fits[len(TARGETS) // 2] if fits and fits[len(TARGETS) // 2]["b_crit"] is not None else {}
    smallest = mean_curve(curves[grid[0]], sorted(curves[grid[0]]))
    agreeing = agreeing_scales(smallest, grid[0], base, epsilon, merrill["cbs_low"], merrill["cbs_high"])
    spread, n = merrill["spread"], min(len(v) for v in losses.values())
    row = {
        **{k: merrill[k] for k in ("cbs", "cbs_point", "cbs_low", "cbs_high")},
        "cbs_level": merrill["level"], "cbs_joint": merrill["joint"], "cbs_comparisons": merrill["comparisons"],
        "seeds": n, "paired_spread": spread,
        "seeds_needed": None if spread is None else seeds_needed(spread, epsilon, len(merrill["grid"])),
        "agreeing_scale_low": agreeing[0], "agreeing_scale_high": agreeing[1],
        "b_crit": headline.get("b_crit"), "b_crit_low": headline.get("low"), "b_crit_high": headline.get("high"),
        "b_crit_target": headline.get("target"),
        "b_crit_censored": " ".join(map(str, headline.get("censored", []))),
        "b_crit_violations": _pairs(headline.get("violations", [])),
        **_predictions(smallest, grid[0], base, scales, epsilon, grid, merrill),
        **{f"{name}{suffix}": scales.get(f"{name}{suffix}") for name in SCALES for suffix in ("", "_se")},
        "relative_cbs": relative_rule(means, epsilon),
    }  # fmt: skip
    return {"row": row, "merrill": merrill, "fits": fits, "losses": losses}


def _pairs(pairs: list[tuple[int, int]]) -> str:
    return " ".join(f"{a}>{b}" for a, b in pairs)


def _finite(loss: float | None) -> float:
    """A diverged branch's loss (null, NaN or ±∞) as +∞: worse than any that trained."""
    return loss if loss is not None and math.isfinite(loss) else math.inf


def _by_rate(record: dict[str, Any]) -> dict[int, dict[float, dict[int, dict]]]:
    """The branches by batch, rate factor and seed, a diverged one's losses read as +∞."""
    grouped: dict[int, dict[float, dict[int, dict]]] = {}
    for branch in record["branches"]:
        branch = {**branch, "loss": _finite(branch["loss"]), "curve": [[t, _finite(x)] for t, x in branch["curve"]]}
        factor = float(branch.get("lr_factor", 1))
        grouped.setdefault(branch["batch_size"], {}).setdefault(factor, {})[branch["seed"]] = branch
    return grouped


def checkpoint_rows(
    record: dict[str, Any], scales: dict[str, float | None], epsilon: float, base: int, seq_len: int = 1
) -> dict:
    """One checkpoint's answers: per ``rates`` (``tuned`` where the grid has more than one rate,
    then ``rule``) its ``cbs.csv`` row (sizes in sequences), branch rows and fits; and its
    ``rates.csv`` rows."""
    with np.errstate(invalid="ignore"):  # a diverged branch: its spread is NaN, its bounds exclude it
        return _checkpoint_rows(record, scales, epsilon, base, seq_len)


def _checkpoint_rows(record: dict[str, Any], scales: dict, epsilon: float, base: int, seq_len: int) -> dict:
    grouped = _by_rate(record)
    best = best_rates(
        {b: {f: {s: x["loss"] for s, x in seeds.items()} for f, seeds in g.items()} for b, g in grouped.items()}
    )
    tuned = any(len(g) > 1 for g in grouped.values())
    choices = {"tuned": {b: best[b][0] for b in grouped}} if tuned else {}
    choices["rule"] = dict.fromkeys(grouped, 1.0)
    edge = " ".join(str(b) for b in sorted(best) if best[b][1])
    found = {"rates": rate_rows(record, grouped, best, seq_len)}
    for rates, factors in choices.items():
        answers = _answers({b: grouped[b][f] for b, f in factors.items()}, record, scales, epsilon, base)
        position = {k: record[k] for k in ("checkpoint", "step", "tokens", "start_loss")}
        found[rates] = {
            "row": {
                **position,
                "base_batch": base,
                "rates": rates,
                "lr_edge": edge if rates == "tuned" else "",
                **answers["row"],
            },
            "branches": _branch_rows(record["checkpoint"], rates, grouped, factors, answers, seq_len, best),
            "fits": answers["fits"],
        }
    return found


def _branch_rows(checkpoint, rates, grouped, factors, answers, seq_len, best) -> list[dict[str, Any]]:
    """The branches ``factors`` (batch → its rate) picks, with Merrill's worst difference of each."""
    epsilon = answers["merrill"]["epsilon"]
    rows = []
    for batch in sorted(factors):
        seeds = grouped[batch][factors[batch]]
        worst = answers["merrill"]["worst"].get(batch)
        mean, se = _mean_se([b["loss"] for b in seeds.values()])
        rows.append(
            {
                "checkpoint": checkpoint, "rates": rates, "batch_size": batch, "lr_factor": factors[batch],
                "lr_edge": rates == "tuned" and best[batch][1], **_memory(next(iter(seeds.values())), seq_len),
                "seeds": len(seeds), "loss": mean, "loss_se": se,
                "difference": worst and worst[0], "difference_half_width": worst and worst[1],
                "within": None if worst is None else worst[0] + worst[1] <= epsilon,
            }
        )  # fmt: skip
    return rows


def rate_rows(record: dict[str, Any], grouped: dict, best: dict, seq_len: int) -> list[dict[str, Any]]:
    """Every (batch, rate) branch of one checkpoint, paired with the rule's rate by seed."""
    rows = []
    for batch in sorted(grouped):
        for factor in sorted(grouped[batch]):
            seeds = grouped[batch][factor]
            rule = {s: b["loss"] for s, b in grouped[batch].get(1.0, seeds).items()}
            difference, half = paired_difference({s: b["loss"] for s, b in seeds.items()}, rule, 0.975)
            mean, se = _mean_se([b["loss"] for b in seeds.values()])
            rows.append(
                {
                    "checkpoint": record["checkpoint"], "batch_size": batch, "lr_factor": factor,
                    **_memory(next(iter(seeds.values())), seq_len), "seeds": len(seeds), "loss": mean,
                    "loss_se": se, "difference": difference,
                    "difference_half_width": None if math.isinf(half) else half,
                    "best": factor == best[batch][0], "lr_edge": factor == best[batch][0] and best[batch][1],
                }
            )  # fmt: skip
    return rows


def _fit_row(checkpoint: str, rates: str, fit: dict, budget: float) -> dict[str, Any]:
    needed = " ".join(f">{budget:.6g}" if t is None else f"{t:.6g}" for t in fit["tokens"])
    return {
        "checkpoint": checkpoint, "rates": rates, "target_loss": fit["target"], "e_min": fit["e_min"],
        "b_crit": fit["b_crit"], "b_crit_low": fit["low"], "b_crit_high": fit["high"],
        "batch_sizes": " ".join(map(str, fit["batches"])), "tokens_needed": needed,
        "censored": " ".join(map(str, fit["censored"])), "violations": _pairs(fit["violations"]),
    }  # fmt: skip


def cbs_tables(
    records: list[dict[str, Any]], summary: Any, case: str, epsilon: float, seq_len: int, base: int
) -> dict[str, list[dict[str, Any]]]:
    """The rows of ``cbs.csv``, ``branches.csv``, ``rates.csv``, ``fits.csv`` and ``curves.csv``
    from the branch records (:func:`~tiny_llm.training.branches.measure_branches`) and the
    analysis's summary rows of ``case``; ``base`` is the base run's batch size."""
    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in COLUMNS}
    for record in sorted(records, key=lambda r: r["step"]):
        found = checkpoint_rows(record, _noise_scales(summary, record["checkpoint"], case), epsilon, base, seq_len)
        tables["rates"] += found.pop("rates")
        for rates, answers in found.items():
            row = {**answers["row"], "case": case}
            row.update({f"{n}_tokens": None if row[n] is None else row[n] * seq_len for n in SIZES})
            tables["cbs"].append(row)
            tables["branches"] += answers["branches"]
            tables["fits"] += [
                _fit_row(record["checkpoint"], rates, fit, record["branches"][0]["curve"][-1][0])
                for fit in answers["fits"]
            ]
        for branch in sorted(record["branches"], key=lambda b: (b["batch_size"], b.get("lr_factor", 1), b["seed"])):
            tables["curves"] += [
                {"checkpoint": record["checkpoint"], "batch_size": branch["batch_size"],
                 "lr_factor": float(branch.get("lr_factor", 1)), "seed": branch["seed"], "tokens": t, "loss": loss}
                for t, loss in branch["curve"]
            ]  # fmt: skip
    for name in ("branches", "rates"):
        for row in tables[name]:
            row["batch_tokens"] = row["batch_size"] * seq_len
    return {name: [{k: _cell(r.get(k)) for k in COLUMNS[name]} for r in rows] for name, rows in tables.items()}


def _cell(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
