"""Figures of cross-seed experiments, drawn from comparison.csv only.

- :func:`dashboard`: one panel per metric against the training tokens (one x range for all; a
  metric recorded without any value is named under the title instead), each with its unit on the
  y-axis, one colour per run in every panel (controls fixed: same seed red, data order green) and
  one legend for the figure. Per-run metrics draw every seed as a line (controls dashed); pair
  metrics draw the mean over seed pairs in black (each pair thin) and each control paired with the
  first seed in its colour, with the baseline for unrelated models dotted, so that "similar"
  always has a reference. 0 tokens is the untrained initialisation of every run.
- :func:`compare_experiments`: the mean over seeds (runs) or seed pairs (pairs) of selected
  metrics for several experiments, one line per experiment label.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

__all__ = ["CONTROL_LABELS", "PAIR_METRICS", "RUN_METRICS", "compare_experiments", "dashboard", "panels", "x_limits"]

RUN_METRICS = (
    "eval_loss",
    "train_loss",
    "reference_grad_norm",
    "function_update_cross_batch_cosine",
    "cov_top_k_share",
    "cov_effective_rank",
    "fisher_trace",
    "hessian_trace",
    "jacobian_frobenius",
    "hessian_top1_eigenvalue",
    "gradient_to_hessian_top1_alignment",
    "llc",
)
CONTROL_LABELS = {
    "same-seed": "control: the first seed trained twice",
    "data-order": "control: the first seed, another data order",
}
SYMMETRY_NOTE = {
    "gradient_cosine": "\n(parameter space: changed by relabelled hidden units)",
    "parameter_subspace_overlap": "\n(parameter space: changed by relabelled hidden units)",
}
PAIR_METRICS = ("gradient_cosine", "function_update_cosine", "parameter_subspace_overlap", "function_subspace_overlap")


def _grid(count: int) -> tuple[plt.Figure, list[plt.Axes]]:
    columns = 3 if count > 4 else 2
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
    flat = list(axes.reshape(-1))
    for ax in flat[count:]:
        ax.set_visible(False)
    return figure, flat[:count]


def _save(figure: plt.Figure, outputs: list[Path], layout: bool = True) -> None:
    if layout:
        figure.tight_layout()
    for path in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.stem}.tmp{path.suffix}")
        figure.savefig(staging, dpi=120)
        staging.replace(path)
    plt.close(figure)


def _short(subject: str, prefix: str) -> str:
    return "|".join(part.removeprefix(prefix) for part in subject.split("|"))


UNITS = {
    "eval_loss": "nats per token",
    "train_loss": "nats per token",
    "reference_grad_norm": "‖ḡ‖ (nats)",
    "function_update_cross_batch_cosine": "cosine",
    "cov_top_k_share": "share of the variance",
    "cov_effective_rank": "effective rank",
    "fisher_trace": "trace (nats²)",
    "hessian_trace": "tr(H) (nats)",
    "jacobian_frobenius": "‖J‖²_F / P",
    "hessian_top1_eigenvalue": "λ₁ (nats)",
    "gradient_to_hessian_top1_alignment": "|cos(ḡ, u₁)|",
    "llc": "LLC (nats)",
    "gradient_cosine": "cosine",
    "function_update_cosine": "cosine",
    "parameter_subspace_overlap": "overlap (0 to 1)",
    "function_subspace_overlap": "overlap (0 to 1)",
}
"""The y-axis label of each metric."""
CONTROL_COLOURS = {"same-seed": "tab:red", "data-order": "tab:green"}
"""A control has one colour in every panel: its run's line and its pair with the first seed."""
SEED_COLOURS = ["tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "0.35"]


def _x(rows: pd.DataFrame) -> str:
    """Training tokens on the x-axis when the records have them (older ones: the step)."""
    return "tokens" if "tokens" in rows and rows["tokens"].notna().all() else "step"


def _colours(frame: pd.DataFrame) -> dict[str, str]:
    """One colour per run, the same in every panel: seeds from a palette, controls fixed."""
    runs = frame[frame["kind"] == "run"][["subject", "role"]].drop_duplicates().sort_values("subject")
    seeds = iter(SEED_COLOURS * 4)
    return {row.subject: CONTROL_COLOURS.get(row.role) or next(seeds) for row in runs.itertuples()}


def _run_panel(ax: plt.Axes, rows: pd.DataFrame, prefix: str, colours: dict[str, str]) -> None:
    for subject, line in rows.groupby("subject", sort=True):
        x = _x(line)
        line = line.sort_values(x)
        role = str(line["role"].iloc[0])
        errors = line["se"] if line["se"].notna().any() else None
        ax.errorbar(
            line[x],
            line["value"],
            yerr=errors,
            marker="o",
            markersize=3,
            capsize=2,
            color=colours.get(subject),
            linestyle="-" if role == "seed" else "--",
            alpha=0.85,
            label=_short(subject, prefix) + ("" if role == "seed" else f" ({CONTROL_LABELS.get(role, role)})"),
        )


def _pair_panel(ax: plt.Axes, rows: pd.DataFrame, controls: dict[str, str]) -> None:
    seeds = rows[(rows["role"] == "seed") & (rows["kind"] == "pair")]
    x = _x(rows)
    for _, line in seeds.groupby("subject"):
        line = line.sort_values(x)
        ax.plot(line[x], line["value"], color="black", alpha=0.2, linewidth=1)
    if not seeds.empty:
        mean = seeds.groupby(x)["value"].mean()
        ax.plot(
            mean.index,
            mean.values,
            color="black",
            linewidth=2.2,
            marker="o",
            markersize=3,
            label=f"seed pairs: mean of {seeds['subject'].nunique()} (thin: each pair)",
        )
    for role, group in rows[~rows["role"].isin(["seed", "other"])].groupby("role", sort=True):
        line = group.sort_values(x)
        ax.plot(
            line[x],
            line["value"],
            color=controls.get(role, "tab:gray"),
            linestyle="--",
            marker="o",
            markersize=3,
            label=f"{CONTROL_LABELS.get(role, role)}, paired with the first seed",
        )


def panels(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The dashboard's metrics in panel order: those with a value (drawn) and those recorded without
    any (e.g. the training loss of checkpoints trained elsewhere, which come without a training log),
    named under the title instead of an empty panel."""
    present, valued = set(frame["metric"]), set(frame.dropna(subset=["value"])["metric"])
    ordered = [m for m in (*RUN_METRICS, *PAIR_METRICS) if m in present]
    return [m for m in ordered if m in valued], [m for m in ordered if m not in valued]


def x_limits(frame: pd.DataFrame) -> tuple[float, float]:
    """One x range for every panel (the experiment's steps or tokens, a margin either side), so that
    a metric measured at fewer checkpoints (a pair's function update has none at the first) is
    placed on the same axis as the others."""
    x = frame[_x(frame)].dropna()
    low, high = float(x.min()), float(x.max())
    margin = 0.04 * (high - low) or max(1.0, 0.04 * abs(high))
    return low - margin, high + margin


def dashboard(comparison: str | Path, outputs: list[str | Path], title: str) -> None:
    """Every metric of one experiment's comparison.csv against the training tokens (see module
    docstring): labelled axes, one colour per run in every panel, and one legend for the figure."""
    frame = pd.read_csv(comparison)
    metrics, empty = panels(frame)
    limits = x_limits(frame)
    figure, axes = _grid(len(metrics))
    prefix = f"{title}-"
    colours = _colours(frame)
    controls = {role: CONTROL_COLOURS.get(role, "tab:gray") for role in frame["role"].unique()}
    handles: dict[str, Any] = {}
    for ax, metric in zip(axes, metrics, strict=True):
        rows = frame[(frame["metric"] == metric)].dropna(subset=["value"])
        if metric in PAIR_METRICS:
            _pair_panel(ax, rows, controls)
        else:
            _run_panel(ax, rows[rows["kind"] == "run"], prefix, colours)
        baseline = frame[(frame["metric"] == metric)].dropna(subset=["baseline"])
        if not baseline.empty:
            ax.axhline(
                float(baseline["baseline"].iloc[0]),
                color="grey",
                linestyle=":",
                label="unrelated models (expected value)",
            )
        ax.set_title(metric.replace("_", " ") + SYMMETRY_NOTE.get(metric, ""), fontsize=10)
        ax.set_xlabel("training tokens (0 = untrained)" if _x(frame) == "tokens" else "training step (0 = untrained)")
        ax.set_ylabel(UNITS.get(metric, "value"), fontsize=9)
        ax.set_xlim(*limits)
        ax.grid(alpha=0.3)
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    note = f"\nno values recorded for these runs: {', '.join(m.replace('_', ' ') for m in empty)}" if empty else ""
    figure.suptitle(f"{title}: seeds at matched training tokens (error bars: ±1 standard error){note}", fontsize=12)
    figure.legend(
        handles.values(), handles.keys(), loc="lower center", ncol=min(3, len(handles)), fontsize=8, frameon=False
    )
    rows = math.ceil(len(handles) / min(3, max(len(handles), 1)))
    figure.tight_layout(rect=(0, 0.04 + 0.025 * rows, 1, 0.96))
    _save(figure, [Path(p) for p in outputs], layout=False)


def compare_experiments(
    comparisons: list[str | Path], labels: list[str], metrics: list[str] | None, outputs: list[str | Path]
) -> None:
    """The mean over seeds (or seed pairs; controls left out) of each metric, per experiment.

    Raises:
        ValueError: labels and comparisons of different lengths, or a metric no experiment has.
    """
    if len(labels) != len(comparisons):
        raise ValueError(f"{len(labels)} labels for {len(comparisons)} experiments; give one label each")
    frames = [pd.read_csv(path) for path in comparisons]
    present = set().union(*(set(f["metric"]) for f in frames))
    chosen = list(metrics) if metrics else [m for m in (*RUN_METRICS, *PAIR_METRICS) if m in present]
    missing = sorted(set(chosen) - present)
    if missing:
        raise ValueError(f"no experiment has the metrics {missing}; available: {sorted(present)}")
    figure, axes = _grid(len(chosen))
    for ax, metric in zip(axes, chosen, strict=True):
        for label, frame in zip(labels, frames, strict=True):
            rows = frame[
                (frame["metric"] == metric) & (frame["role"] == "seed") & frame["kind"].isin(["run", "pair"])
            ].dropna(subset=["value"])
            if rows.empty:
                continue
            mean = rows.groupby("step")["value"].mean()
            ax.plot(mean.index, mean.values, marker="o", markersize=3, label=label)
            baseline = rows.dropna(subset=["baseline"])
            if not baseline.empty:
                ax.axhline(
                    float(baseline["baseline"].iloc[0]),
                    linestyle=":",
                    color=ax.lines[-1].get_color(),
                    label=f"{label}: unrelated models",
                )
        ax.set_title(metric.replace("_", " ") + SYMMETRY_NOTE.get(metric, ""), fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle("experiments compared: mean over seeds or seed pairs", fontsize=11)
    _save(figure, [Path(p) for p in outputs])
