"""Figures of cross-seed experiments, drawn from comparison.csv only.

- :func:`dashboard`: one panel per metric against the training step. Per-run metrics draw every
  seed as a line (controls dashed); pair metrics draw seed pairs and control pairs, with the
  baseline for unrelated models dotted, so that "similar" always has a reference. Step 0 is the
  untrained initialisation of every run.
- :func:`compare_experiments`: the mean over seeds (runs) or seed pairs (pairs) of selected
  metrics for several experiments, one line per experiment label.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

__all__ = ["CONTROL_LABELS", "PAIR_METRICS", "RUN_METRICS", "compare_experiments", "dashboard"]

RUN_METRICS = ("eval_loss", "train_loss", "reference_grad_norm", "function_update_cross_batch_cosine",
               "cov_top_k_share", "cov_effective_rank", "fisher_trace", "hessian_trace", "jacobian_frobenius",
               "hessian_top1_eigenvalue", "gradient_to_hessian_top1_alignment", "llc")
CONTROL_LABELS = {"same-seed": "control: the first seed trained twice",
                  "data-order": "control: the first seed, another data order"}
SYMMETRY_NOTE = {"gradient_cosine": "\n(parameter space: changed by relabelled hidden units)",
                 "parameter_subspace_overlap": "\n(parameter space: changed by relabelled hidden units)"}
PAIR_METRICS = ("gradient_cosine", "function_update_cosine", "parameter_subspace_overlap",
                "function_subspace_overlap")


def _grid(count: int) -> tuple[plt.Figure, list[plt.Axes]]:
    columns = 3 if count > 4 else 2
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.4 * rows), squeeze=False)
    flat = list(axes.reshape(-1))
    for ax in flat[count:]:
        ax.set_visible(False)
    return figure, flat[:count]


def _save(figure: plt.Figure, outputs: list[Path]) -> None:
    figure.tight_layout()
    for path in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.stem}.tmp{path.suffix}")
        figure.savefig(staging, dpi=120)
        staging.replace(path)
    plt.close(figure)


def _short(subject: str, prefix: str) -> str:
    return "|".join(part.removeprefix(prefix) for part in subject.split("|"))


def _run_panel(ax: plt.Axes, rows: pd.DataFrame, prefix: str) -> None:
    for subject, line in rows.groupby("subject", sort=True):
        line = line.sort_values("step")
        role = str(line["role"].iloc[0])
        errors = line["se"] if line["se"].notna().any() else None
        ax.errorbar(line["step"], line["value"], yerr=errors, marker="o", markersize=3, capsize=2,
                    linestyle="-" if role == "seed" else "--", alpha=0.85,
                    label=_short(subject, prefix) + ("" if role == "seed" else " (control)"))


def _pair_panel(ax: plt.Axes, rows: pd.DataFrame) -> None:
    seeds = rows[(rows["role"] == "seed") & (rows["kind"] == "pair")]
    for _, line in seeds.groupby("subject"):
        line = line.sort_values("step")
        ax.plot(line["step"], line["value"], color="tab:blue", alpha=0.25, linewidth=1)
    if not seeds.empty:
        mean = seeds.groupby("step")["value"].mean()
        ax.plot(mean.index, mean.values, color="tab:blue", linewidth=2.2, marker="o", markersize=3,
                label=f"seed pairs (mean of {seeds['subject'].nunique()}; thin: each)")
    colours = iter(["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"])
    for role, group in rows[~rows["role"].isin(["seed", "other"])].groupby("role", sort=True):
        line = group.sort_values("step")
        ax.plot(line["step"], line["value"], color=next(colours), linestyle="--", marker="o", markersize=3,
                label=CONTROL_LABELS.get(role, role))


def dashboard(comparison: str | Path, outputs: list[str | Path], title: str) -> None:
    """Every metric of one experiment's comparison.csv against the step (see module docstring)."""
    frame = pd.read_csv(comparison)
    metrics = [m for m in (*RUN_METRICS, *PAIR_METRICS) if m in set(frame["metric"])]
    figure, axes = _grid(len(metrics))
    prefix = f"{title}-"
    for ax, metric in zip(axes, metrics):
        rows = frame[(frame["metric"] == metric)].dropna(subset=["value"])
        if metric in PAIR_METRICS:
            _pair_panel(ax, rows)
        else:
            _run_panel(ax, rows[rows["kind"] == "run"], prefix)
        baseline = frame[(frame["metric"] == metric)].dropna(subset=["baseline"])
        if not baseline.empty:
            value = float(baseline["baseline"].iloc[0])
            ax.axhline(value, color="grey", linestyle=":", label=f"unrelated models ({value:.3g})")
        ax.set_title(metric.replace("_", " ") + SYMMETRY_NOTE.get(metric, ""), fontsize=10)
        ax.set_xlabel("training step (0 = untrained)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    figure.suptitle(f"{title}: seeds at matched steps (controls dashed, baselines dotted; "
                    "error bars: ±1 standard error)", fontsize=11)
    _save(figure, [Path(p) for p in outputs])


def compare_experiments(comparisons: list[str | Path], labels: list[str], metrics: list[str] | None,
                        outputs: list[str | Path]) -> None:
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
    for ax, metric in zip(axes, chosen):
        for label, frame in zip(labels, frames):
            rows = frame[(frame["metric"] == metric) & (frame["role"] == "seed")
                         & frame["kind"].isin(["run", "pair"])].dropna(subset=["value"])
            if rows.empty:
                continue
            mean = rows.groupby("step")["value"].mean()
            ax.plot(mean.index, mean.values, marker="o", markersize=3, label=label)
            baseline = rows.dropna(subset=["baseline"])
            if not baseline.empty:
                ax.axhline(float(baseline["baseline"].iloc[0]), linestyle=":", color=ax.lines[-1].get_color(),
                           label=f"{label}: unrelated models")
        ax.set_title(metric.replace("_", " ") + SYMMETRY_NOTE.get(metric, ""), fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.suptitle("experiments compared: mean over seeds or seed pairs", fontsize=11)
    _save(figure, [Path(p) for p in outputs])
