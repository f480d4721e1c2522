"""The critical-batch figure: each checkpoint's held-out loss against the branch batch size (with
the base batch and the ε band of Merrill et al.'s rule), and the three answers beside the noise
scales over training (:mod:`tiny_llm.results.cbs` makes the tables it draws)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from tiny_llm.results.drawing import COLUMN, RC, engineering

__all__ = ["draw_cbs"]


def _losses(ax, cbs: pd.DataFrame, branches: pd.DataFrame, epsilon: float) -> None:
    """Left: loss ±1 standard error per batch size, the ε band above the base batch's loss (over
    the batches Merrill's rule compares), B* ringed, the base batch dotted."""
    for index, (checkpoint, rows) in enumerate(branches.groupby("checkpoint", sort=False)):
        colour, row = f"C{index % 10}", cbs[cbs["checkpoint"] == checkpoint].iloc[0]
        ax.errorbar(
            rows["batch_tokens"], rows["loss"], yerr=rows["loss_se"].astype(float).fillna(0), color=colour,
            marker="o", ms=3, capsize=2, label=f"from {engineering(float(row['tokens']))} tokens",
        )  # fmt: skip
        base = rows[rows["batch_size"] == row["base_batch"]]
        reference = float(base["loss"].iloc[0])
        right = rows[rows["batch_size"] >= row["base_batch"]]["batch_tokens"]
        ax.fill_between([right.min(), right.max()], reference, reference + epsilon, color=colour, alpha=0.12, lw=0)
        chosen = rows[rows["batch_size"] == row["cbs"]]
        ax.plot(chosen["batch_tokens"], chosen["loss"], "o", ms=8, mfc="none", color=colour)
    base_tokens = float(branches[branches["batch_size"] == cbs["base_batch"].iloc[0]]["batch_tokens"].iloc[0])
    ax.axvline(base_tokens, color="0.5", ls=":", lw=0.8, label="base batch")
    ax.fill_between([], [], [], color="0.5", alpha=0.12, lw=0, label=f"ε = {epsilon:g} nats above it")
    ax.plot([], [], "o", ms=8, mfc="none", color="0.3", label="B* (Merrill's rule)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("branch batch (tokens)")
    ax.set_ylabel("held-out loss after the budget")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=1, frameon=False)


def _finite(values: pd.Series, top: float) -> tuple[np.ndarray, np.ndarray]:
    """Values as floats, infinite ones at ``top``; and where they were infinite."""
    array = values.astype(float).to_numpy()
    infinite = np.isinf(array)
    return np.where(infinite, top, array), infinite


SCALE_MARKS = (
    ("b_simple", "v", "C1", 0.45, "B_simple"),
    ("b_noise", "D", "C2", 0.55, "B_noise"),
    ("precond_b_simple", "<", "C4", 0.65, "B_simple,P (the optimizer's geometry)"),
    ("precond_b_noise", ">", "C5", 0.75, "B_noise,P (the optimizer's geometry)"),
)
"""The noise scales drawn beside the answers: name, marker, colour, offset, label (hollow: preconditioned)."""
PREDICTION_MARKS = {"b_simple": "+", "b_noise": "x", "precond_b_simple": "1", "precond_b_noise": "2"}
"""The marker of the B* each noise scale predicts (drawn in its scale's colour, left of B*)."""


def primary(cbs: pd.DataFrame) -> pd.DataFrame:
    """The rows the figure leads with: each checkpoint's tuned answers where the grid tuned the
    rates, else the rule's."""
    if "rates" not in cbs:
        return cbs
    tuned = cbs[cbs["rates"] == "tuned"]
    return (tuned if len(tuned) else cbs[cbs["rates"] == "rule"]).reset_index(drop=True)


def _bounds(ax, x, cbs: pd.DataFrame, top: float) -> None:
    """B*'s interval (a bar; ▲ where the grid cannot bound it above) and B* itself."""
    high, unbounded = _finite(cbs["cbs_high_tokens"].astype(float).fillna(np.inf), top)
    ax.vlines(x, cbs["cbs_tokens"].astype(float), high, color="k", lw=4, alpha=0.3, label="B*: where the data put it")
    ax.plot(x, cbs["cbs_tokens"].astype(float), "ks", ms=4, label="B* (Merrill's rule)")
    if unbounded.any():
        ax.plot(x[unbounded], high[unbounded], "k^", ms=4, label="not bounded above by the grid")


def _predictions(ax, x, cbs: pd.DataFrame, top: float, seq_len: pd.Series) -> None:
    """Each noise scale's predicted B* with its interval, in its scale's colour."""
    for index, (name, _, colour, _, label) in enumerate(SCALE_MARKS):
        column = f"{name}_cbs_tokens"
        if column not in cbs or cbs[column].astype(float).isna().all():
            continue
        value, _ = _finite(cbs[column], top)
        low = (cbs[f"{name}_cbs_low"].astype(float) * seq_len).fillna(pd.Series(value)).to_numpy()
        high, _ = _finite((cbs[f"{name}_cbs_high"].astype(float) * seq_len).fillna(pd.Series(value)), top)
        shift = -0.45 + 0.1 * index
        ax.errorbar(
            x + shift, value, yerr=[np.maximum(value - low, 0), np.maximum(high - value, 0)],
            fmt=PREDICTION_MARKS[name], color=colour, ms=6, capsize=2, label=f"B* that {label.split(' ')[0]} predicts",
        )  # fmt: skip


def _answers(ax, cbs: pd.DataFrame) -> None:
    """Right: per checkpoint (one column each, labelled by its training tokens), B*'s interval, B_crit
    with its bootstrap interval (▲ where it is unbounded), the B* each noise scale predicts with its
    interval, and B_simple and B_noise ±1 standard error (and, where measured, B_simple,P and
    B_noise,P in the optimizer's geometry), in tokens; the rule's-rate B* hollow beside a tuned one."""
    everything, cbs = cbs, primary(cbs)
    x = np.arange(len(cbs), dtype=float)
    sizes = [everything[c].astype(float) for c in everything.columns if c.endswith("_tokens")]
    finite = np.concatenate([s[np.isfinite(s)].to_numpy() for s in sizes])
    top = 4 * finite.max() if finite.size else 1.0
    seq_len = cbs["cbs_tokens"].astype(float) / cbs["cbs"].astype(float)
    _bounds(ax, x, cbs, top)
    if "rates" in everything and (everything["rates"] == "tuned").any():
        rule = everything[everything["rates"] == "rule"].reset_index(drop=True)
        ax.plot(
            x + 0.12, rule["cbs_tokens"].astype(float), "s", mfc="none", color="k", ms=4, label="B* at the rule's rates"
        )
    crit, _ = _finite(cbs["b_crit_tokens"], top)
    low, _ = _finite(cbs["b_crit_low_tokens"], top)
    upper, upper_inf = _finite(cbs["b_crit_high_tokens"], top)
    shown = ~np.isnan(crit)
    ax.errorbar(
        x[shown] + 0.25, crit[shown], yerr=[np.maximum(crit - low, 0)[shown], np.maximum(upper - crit, 0)[shown]],
        fmt="o", color="C3", ms=4, capsize=2, label="B_crit (fit; bootstrap interval, ▲ unbounded)",
    )  # fmt: skip
    ax.plot(x[upper_inf & shown] + 0.25, upper[upper_inf & shown], "^", color="C3", ms=5)
    _predictions(ax, x, cbs, top, seq_len)
    for name, marker, colour, shift, label in SCALE_MARKS:
        if f"{name}_tokens" not in cbs or cbs[f"{name}_tokens"].astype(float).isna().all():
            continue  # the optimizer's geometry: where the analysis measured it
        error = (cbs[f"{name}_se"].astype(float) * seq_len).fillna(0)
        ax.errorbar(
            x + shift, cbs[f"{name}_tokens"].astype(float), yerr=error, fmt=marker, color=colour, ms=3, capsize=2,
            label=label, mfc="none" if name.startswith("precond_") else colour,
        )  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlim(-0.7, len(cbs) - 0.1)
    ax.set_xticks(x + 0.15, [engineering(float(t)) for t in cbs["tokens"]])
    ax.set_xlabel("training tokens at the checkpoint")
    ax.set_ylabel("batch size (tokens)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)


def draw_cbs(cbs: pd.DataFrame, branches: pd.DataFrame, outputs: list[str | Path], title: str, epsilon: float) -> None:
    """The figure of ``cbs.csv`` and ``branches.csv`` (blank cells as None), written atomically to
    each of ``outputs``."""
    if "rates" in branches:
        branches = branches[branches["rates"] == primary(cbs)["rates"].iloc[0]]
    with plt.rc_context(RC):
        fig, (left, right) = plt.subplots(1, 2, figsize=(2 * COLUMN[0], COLUMN[1]))
        _losses(left, primary(cbs), branches, epsilon)
        _answers(right, cbs)
        fig.subplots_adjust(wspace=0.4)
        fig.suptitle(title, fontsize=7, color="0.3", x=0.01, ha="left")
        for path in map(Path, outputs):
            staging = path.with_name(f".{path.stem}.tmp{path.suffix}")
            fig.savefig(staging, bbox_inches="tight")
            staging.replace(path)
        plt.close(fig)
