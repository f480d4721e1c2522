"""A study across seeds (``seed_studies``): the analyses of one model trained from several seeds
(PolyPythia's repositories, say), side by side. ``seeds.csv`` holds, for every step and case the
seeds share, each statistic's mean over the seeds, its sample standard deviation, its range and how
many seeds gave it; the ``seeds`` figure draws the mean and the range against the training step,
one panel per statistic, on a logarithmic step axis when the steps are log-spaced (Pythia's early
revisions 1, 2, 4, …, 512 stay apart from the later ones). Written atomically.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from tiny_llm.io import atomic_path
from tiny_llm.layout import MANIFEST
from tiny_llm.results.drawing import window_note

__all__ = ["STUDY_STATISTICS", "read_summaries", "seed_table", "study_figure", "write_study"]

STUDY_STATISTICS = (
    ("loss", "epoch loss (nats per token)"),
    ("b_simple", "B_simple (sequences)"),
    ("b_noise", "B_noise (sequences)"),
    ("grad_curvature", "ḡᵀHḡ (nats³)"),
    ("random_curvature", "tr(H)/D (nats)"),
    ("normalized_alignment", "Σvᵀ Hv / Σ‖v‖² (nats)"),
    ("full_grad_norm", "‖ḡ‖ (nats)"),
    ("step_sharpness", "ΔᵀHΔ / ‖Δ‖² (nats)"),
)
"""The statistics a study draws (summary.csv columns and their labels, with the units of the
summary's columns: parameters counted as dimensionless)."""


def seed_table(summaries: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per (case, step) that at least one seed measured: per statistic its ``_mean``,
    ``_std`` (ddof 1; blank with one seed), ``_min``, ``_max`` and ``_seeds`` (how many gave a
    value), and ``seeds`` (how many measured the step). ``summaries``: each seed's summary.csv by
    its analysis name."""
    frames = []
    for seed, table in summaries.items():
        kept = table.drop_duplicates(["state_key", "case"]) if "state_key" in table else table
        frames.append(kept.assign(seed=seed))
    rows = pd.concat(frames, ignore_index=True)
    rows["step"] = pd.to_numeric(rows["step"], errors="coerce")
    out = []
    for (case, step), group in rows.groupby(["case", "step"], sort=True):
        row = {"case": case, "step": int(step), "seeds": group["seed"].nunique()}
        tokens = pd.to_numeric(group.get("tokens"), errors="coerce") if "tokens" in group else None
        row["tokens"] = None if tokens is None or tokens.isna().all() else float(tokens.mean())
        for name, _ in STUDY_STATISTICS:
            values = pd.to_numeric(group[name], errors="coerce").dropna() if name in group else pd.Series(dtype=float)
            row |= {
                f"{name}_mean": values.mean() if len(values) else None,
                f"{name}_std": values.std(ddof=1) if len(values) > 1 else None,
                f"{name}_min": values.min() if len(values) else None,
                f"{name}_max": values.max() if len(values) else None,
                f"{name}_seeds": len(values),
            }
        out.append(row)
    return pd.DataFrame(out)


def _log_spaced(steps: np.ndarray) -> bool:
    """Whether positive steps span more than a decade (log-spaced revisions: 1, 2, 4, ... would
    crowd at the left of a linear axis)."""
    positive = steps[steps > 0]
    return len(positive) > 2 and positive.max() / positive.min() > 10


def _panel(ax, table: pd.DataFrame, name: str, label: str, log_x: bool) -> None:
    for index, (case, rows) in enumerate(table.groupby("case", sort=False)):
        mean = pd.to_numeric(rows[f"{name}_mean"], errors="coerce")
        keep = mean.notna().to_numpy()
        if not keep.any():
            continue
        x = rows["step"].to_numpy(dtype=float)[keep]
        low = pd.to_numeric(rows[f"{name}_min"], errors="coerce").to_numpy(dtype=float)[keep]
        high = pd.to_numeric(rows[f"{name}_max"], errors="coerce").to_numpy(dtype=float)[keep]
        colour, seeds = f"C{index}", pd.to_numeric(rows[f"{name}_seeds"]).to_numpy()[keep]
        ax.fill_between(x, low, high, color=colour, alpha=0.25, lw=0)
        y = mean.to_numpy(dtype=float)[keep]
        n = int(seeds.max())
        ax.plot(x, y, color=colour, lw=1.0, label=f"{case} ({f'mean of up to {n} seeds' if n > 1 else 'one seed'})")
        ax.plot(x[seeds > 1], y[seeds > 1], "o", color=colour, ms=2.5)
        ax.plot(x[seeds == 1], y[seeds == 1], "o", color=colour, ms=3, mfc="none")  # one seed: not a mean
    values = pd.concat([pd.to_numeric(table[f"{name}_{k}"], errors="coerce") for k in ("min", "max")]).dropna()
    if len(values) and (values > 0).all() and values.max() / values.min() > 30:
        ax.set_yscale("log")
    if log_x:
        ax.set_xscale("symlog", linthresh=1.0, linscale=0.3)
    ax.set_title(label, fontsize=8, loc="left")
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def _windows(summaries: dict[str, Path]) -> list[str]:
    """The training-order cases' windows of the seeds' analyses, from the manifest beside each
    summary.csv (once where the seeds agree, as they do for one model's suites)."""
    parts: dict[str, list[str]] = {}
    for path in summaries.values():
        manifest = Path(path).with_name(MANIFEST)
        if manifest.exists():
            note = window_note(json.loads(manifest.read_text()).get("data") or {})
            for part in filter(None, note.split("; ")):
                case, _, window = part.partition(": ")
                if window not in parts.setdefault(case, []):
                    parts[case].append(window)
    cases = [f"{case}: {' / '.join(windows)}" for case, windows in parts.items()]
    return [f"windows: {'; '.join(cases)}"] if cases else []


def read_summaries(summaries: dict[str, Path]) -> dict[str, pd.DataFrame]:
    """Each seed's summary.csv, by its analysis name.

    Raises:
        ValueError: a summary.csv that is missing or lacks the step column, naming it.
    """
    tables = {}
    for seed, path in summaries.items():
        if not Path(path).exists():
            raise ValueError(f"{path} does not exist: analysis {seed} has not been collected")
        tables[seed] = pd.read_csv(path)
        if "step" not in tables[seed] or "case" not in tables[seed]:
            raise ValueError(f"{path} is not an analysis's summary.csv (no step or case column)")
    return tables


def study_figure(name: str, table: pd.DataFrame, summaries: dict[str, Path], notes: list[str]):
    """The ``seeds`` figure of study ``name``'s table: one panel per statistic with values, the mean
    (hollow where one seed gave it) and the range per case; titled with n, the cases' windows and
    ``notes``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(n, label) for n, label in STUDY_STATISTICS if table[f"{n}_mean"].notna().any()]
    columns = 2
    rows = max(1, math.ceil(len(shown) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(7.2, 1.9 * rows + 0.9), squeeze=False, sharex=True)
    log_x = _log_spaced(table["step"].to_numpy(dtype=float))
    for ax, (statistic, label) in zip(list(axes.flat)[: len(shown)], shown, strict=True):
        _panel(ax, table, statistic, label, log_x)
    for ax in list(axes.flat)[len(shown) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("training step" + (" (log scale above 1)" if log_x else ""), fontsize=8)
    title = f"{name}: mean over the n = {len(summaries)} seeds ({', '.join(summaries)}), shaded: their range"
    single = int((table["seeds"] == 1).sum())
    notes = [
        *(
            [f"hollow: {single} points measured by one seed only (n = 1: that seed's value, not a mean)"]
            if single
            else []
        ),
        *_windows(summaries),
        *notes,
    ]
    text = "\n".join([title, *(textwrap.fill(n, 140) for n in notes)])
    fig.suptitle(text, fontsize=7, x=0.01, y=0.995, ha="left", va="top")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 2), fontsize=7, frameon=False)
    # the legend's rows (about 0.15 in each) below the panels; tight_layout leaves the title its room
    bottom = (0.1 + 0.15 * -(-len(labels) // 2)) / fig.get_figheight() if handles else 0.02
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def write_study(name: str, summaries: dict[str, Path], out_dir: str | Path, notes: list[str]) -> list[Path]:
    """``seeds.csv`` and the ``seeds`` figure (pdf and png) of study ``name`` in ``out_dir`` from its
    seeds' summary.csv files; ``notes``: what the planner found across the seeds (shared weights),
    written under the figure. Returns the written paths.

    Raises:
        ValueError: a summary.csv that is missing or lacks the step column, naming it.
    """
    import matplotlib.pyplot as plt

    table = seed_table(read_summaries(summaries))
    out_dir = Path(out_dir)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / "seeds.csv") as tmp:
        table.to_csv(tmp, index=False)
    fig = study_figure(name, table, summaries, notes)
    written = [out_dir / "seeds.csv"]
    for ext in ("pdf", "png"):
        path = out_dir / "figures" / f"seeds.{ext}"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, dpi=200)
        written.append(path)
    plt.close(fig)
    return written
