"""The critical batch size measured by branched training, beside the noise scales that predict it.

For each checkpoint of a critical-batch-size experiment, every batch size B of the grid was trained
on from the checkpoint for the same token budget, once per data-order seed, and its loss measured on
held-out data (:mod:`tiny_llm.training.branches`). Here:

* :func:`critical_batch`: the mean loss (and its standard error over the seeds) of each batch size,
  the best of them, and the critical batch size: the largest batch whose mean loss is within ε of
  the best (``loss ≤ (1 + ε) · best``), with its interval on the grid, [B*, the next batch size)
  (open above when B* is the grid's largest: the critical batch size is at least B*).
* :func:`cbs_tables`: ``cbs.csv`` (one row per checkpoint: B*, its interval, and B_simple and B_noise
  with their standard errors from the experiment's analysis at the same checkpoint, in sequences and
  in tokens) and ``branches.csv`` (one row per checkpoint and batch size).
* :func:`draw_cbs`: the figure: held-out loss against batch size per checkpoint, and B*, B_simple
  and B_noise against training tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from tiny_llm.results.drawing import COLUMN, RC, engineering

__all__ = ["BRANCH_COLUMNS", "CBS_COLUMNS", "cbs_tables", "critical_batch", "draw_cbs"]

CBS_COLUMNS = [
    "checkpoint",
    "step",
    "tokens",
    "best_batch",
    "best_loss",
    "cbs",
    "cbs_upper",
    "b_simple",
    "b_simple_se",
    "b_noise",
    "b_noise_se",
    "cbs_tokens",
    "cbs_upper_tokens",
    "b_simple_tokens",
    "b_simple_se_tokens",
    "b_noise_tokens",
    "b_noise_se_tokens",
]
"""``cbs.csv``: sizes in sequences, then the same in tokens (× the sequence length); ``cbs_upper``
blank when the critical batch size is the grid's largest batch (it is at least that)."""
BRANCH_COLUMNS = [
    "checkpoint",
    "tokens",
    "batch_size",
    "batch_tokens",
    "steps",
    "lr",
    "seeds",
    "loss",
    "loss_se",
    "within",
]
"""``branches.csv``: the mean held-out loss of each batch size over its data-order seeds, its
standard error (blank with one seed) and whether it is within ε of the best."""


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def critical_batch(losses: dict[int, list[float]], epsilon: float) -> dict[str, Any]:
    """The critical batch size of one checkpoint from ``losses`` (batch size → held-out loss of
    each seed): ``means``, ``errors``, ``best_batch``, ``best_loss``, ``within`` (the batch sizes
    within ε of the best), ``cbs`` and ``cbs_upper`` (None at the grid's top)."""
    grid = sorted(losses)
    means, errors = {}, {}
    for batch in grid:
        means[batch], errors[batch] = _mean_se(losses[batch])
    best_batch = min(grid, key=lambda b: means[b])
    within = [b for b in grid if means[b] <= (1 + epsilon) * means[best_batch]]
    cbs = max(within)
    upper = next((b for b in grid if b > cbs), None)
    return {
        "means": means,
        "errors": errors,
        "best_batch": best_batch,
        "best_loss": means[best_batch],
        "within": within,
        "cbs": cbs,
        "cbs_upper": upper,
    }


def _cell(value: Any) -> Any:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _noise_scales(summary: pd.DataFrame, checkpoint: str, case: str) -> dict[str, float | None]:
    row = summary[(summary["file"] == f"{checkpoint}.safetensors") & (summary["case"] == case)]
    names = ("b_simple", "b_simple_se", "b_noise", "b_noise_se")
    if row.empty:
        return dict.fromkeys(names)
    return {name: None if pd.isna(row.iloc[0][name]) else float(row.iloc[0][name]) for name in names}


def cbs_tables(
    records: list[dict[str, Any]], summary: pd.DataFrame, case: str, epsilon: float, seq_len: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of ``cbs.csv`` and ``branches.csv`` from the branch records (one per checkpoint:
    ``checkpoint``, ``step``, ``tokens`` and ``branches``, each with ``batch_size``, ``seed``,
    ``steps``, ``lr`` and ``loss``) and the analysis's summary rows of ``case``."""
    cbs_rows, branch_rows = [], []
    for record in sorted(records, key=lambda r: r["step"]):
        losses: dict[int, list[float]] = {}
        for branch in record["branches"]:
            losses.setdefault(branch["batch_size"], []).append(branch["loss"])
        found = critical_batch(losses, epsilon)
        scales = _noise_scales(summary, record["checkpoint"], case)
        tokens = {f"{k}_tokens": None if v is None else v * seq_len for k, v in scales.items()}
        upper = found["cbs_upper"]
        cbs_rows.append(
            {
                "checkpoint": record["checkpoint"],
                "step": record["step"],
                "tokens": record["tokens"],
                "best_batch": found["best_batch"],
                "best_loss": found["best_loss"],
                "cbs": found["cbs"],
                "cbs_upper": upper,
                **scales,
                "cbs_tokens": found["cbs"] * seq_len,
                "cbs_upper_tokens": None if upper is None else upper * seq_len,
                **tokens,
            }
        )
        for batch in sorted(losses):
            first = next(b for b in record["branches"] if b["batch_size"] == batch)
            branch_rows.append(
                {
                    "checkpoint": record["checkpoint"],
                    "tokens": record["tokens"],
                    "batch_size": batch,
                    "batch_tokens": batch * seq_len,
                    "steps": first["steps"],
                    "lr": first["lr"],
                    "seeds": len(losses[batch]),
                    "loss": found["means"][batch],
                    "loss_se": found["errors"][batch],
                    "within": batch in found["within"],
                }
            )
    return [{k: _cell(r[k]) for k in CBS_COLUMNS} for r in cbs_rows], [
        {k: _cell(r[k]) for k in BRANCH_COLUMNS} for r in branch_rows
    ]


def draw_cbs(
    cbs: pd.DataFrame,
    branches: pd.DataFrame,
    outputs: list[str | Path],
    title: str,
    epsilon: float,
    bottom: int | None = None,
) -> None:
    """Left: each checkpoint's held-out loss against the batch size (tokens), ±1 standard error over
    the seeds, the critical batch size ringed. Right: the critical batch size (its grid interval as a
    bar; an arrow where it is the grid's top), B_simple and B_noise (±1 standard error) against the
    checkpoint's training tokens, all in tokens. ``bottom``: the grid's smallest batch (sequences),
    whose critical batch size lies anywhere below the next (default: the smallest found)."""
    with plt.rc_context(RC):
        fig, (left, right) = plt.subplots(1, 2, figsize=(2 * COLUMN[0], COLUMN[1]))
        for index, (checkpoint, rows) in enumerate(branches.groupby("checkpoint", sort=False)):
            colour = f"C{index % 10}"
            tokens = engineering(float(rows["tokens"].iloc[0]))
            left.errorbar(
                rows["batch_tokens"], rows["loss"], yerr=rows["loss_se"].fillna(0), color=colour, marker="o",
                capsize=2, label=f"from {tokens} tokens",
            )  # fmt: skip
            star = cbs[cbs["checkpoint"] == checkpoint]["cbs_tokens"].iloc[0]
            chosen = rows[rows["batch_tokens"] == star]
            left.plot(chosen["batch_tokens"], chosen["loss"], "o", ms=8, mfc="none", color=colour)
        left.set_xscale("log", base=2)
        left.set_xlabel("branch batch (tokens)")
        left.set_ylabel("held-out loss after the budget")
        left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
        x = cbs["tokens"].astype(float)
        upper = cbs["cbs_upper_tokens"].astype(float)
        at_top = upper.isna()
        right.vlines(x, cbs["cbs_tokens"], upper.fillna(cbs["cbs_tokens"] * 2), color="k", lw=3, alpha=0.3,
                     label="its interval on the grid")  # fmt: skip
        right.plot(x, cbs["cbs_tokens"], "ks", label=f"critical batch (measured, ε = {epsilon:g})")
        at_bottom = cbs["cbs"] == (cbs["cbs"].min() if bottom is None else bottom)
        if at_top.any():
            right.plot(x[at_top], cbs["cbs_tokens"][at_top] * 2, "k^", label="grid top: at least its largest")
        if at_bottom.any():
            right.plot(x[at_bottom], cbs["cbs_tokens"][at_bottom] / 2, "kv", label="grid bottom: below the next")
        for name, marker, colour in (("b_simple", "o", "C1"), ("b_noise", "D", "C2")):
            values = cbs[f"{name}_tokens"].astype(float)
            right.errorbar(
                x, values, yerr=cbs[f"{name}_se_tokens"].astype(float).fillna(0), fmt=marker, color=colour,
                capsize=2, label={"b_simple": "B_simple", "b_noise": "B_noise"}[name],
            )  # fmt: skip
        right.set_yscale("log")
        right.set_xlabel("training tokens at the checkpoint")
        right.set_ylabel("batch size (tokens)")
        right.xaxis.set_major_formatter(plt.FuncFormatter(engineering))
        right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
        fig.subplots_adjust(wspace=0.35)
        fig.suptitle(title, fontsize=7, color="0.3", x=0.01, ha="left")
        for path in map(Path, outputs):
            staging = path.with_name(f".{path.stem}.tmp{path.suffix}")
            fig.savefig(staging, bbox_inches="tight")
            staging.replace(path)
        plt.close(fig)
