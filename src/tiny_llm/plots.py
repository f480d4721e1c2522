"""Figures from saved results only (summary.csv + manifest.json, optionally the training log).

Every figure plots against training tokens, seen solid and unseen dashed on shared axes, one
point per unique parameter state (aliases are drawn once); packed runs add the aggregate
consensus curve. Each figure is written as PDF and PNG, sized for a paper column.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

__all__ = ["FIGURES", "SPECTRUM_FIGURES", "plot_analysis", "plot_spectrum"]

log = logging.getLogger(__name__)

FIGURES = ["loss", "normalized_alignment", "noise_alignment", "gradient_norms", "batch_sizes"]
STYLE = {"seen": "-", "unseen": "--"}
COLUMN = (3.5, 2.6)  # inches: one column of a two-column paper
_RC = {"font.size": 8, "axes.labelsize": 8, "legend.fontsize": 6.5, "xtick.labelsize": 7, "ytick.labelsize": 7,
       "lines.linewidth": 1.2, "lines.markersize": 3, "axes.grid": True, "grid.alpha": 0.3,
       "savefig.bbox": "tight", "savefig.dpi": 200}


def _states(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (state, case): the earliest alias."""
    return summary.sort_values(["tokens", "file"]).drop_duplicates(["state_key", "case"]).sort_values("tokens")


def _curves(ax, table: pd.DataFrame, column: str, label: str, color: str, log: bool = False) -> int:
    """Draw ``column`` for each case; returns how many non-positive values a log axis omitted."""
    omitted = 0
    for case, rows in table.groupby("case", sort=False):
        y = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)
        x = rows["tokens"].to_numpy(dtype=float)
        keep = np.isfinite(y) & (y > 0 if log else True)
        omitted += int((np.isfinite(y) & ~keep).sum())
        if keep.any():
            ax.plot(x[keep], y[keep], STYLE.get(case, ":"), marker="o", color=color, label=f"{label} ({case})")
    return omitted


def _finish(fig, ax, out_dir: Path, name: str, ylabel: str, legend: bool = True) -> list[Path]:
    ax.set_xlabel("training tokens")
    ax.set_ylabel(ylabel)
    if legend:
        ax.legend(loc="best", frameon=False)
    paths = [out_dir / f"{name}.{ext}" for ext in ("pdf", "png")]
    for path in paths:
        fig.savefig(path)
    plt.close(fig)
    return paths


def _annotate_omitted(ax, omitted: int) -> None:
    if omitted:
        ax.set_title(f"log scale: {omitted} non-positive value{'s' * (omitted > 1)} omitted",
                     loc="left", fontsize=6, color="0.3")


def _normalized_alignment(table, consensus, out_dir) -> list[Path]:
    fig, (linear, logarithmic) = plt.subplots(2, 1, sharex=True, figsize=(COLUMN[0], 1.6 * COLUMN[1]))
    omitted = 0
    for ax, log in ((linear, False), (logarithmic, True)):
        omitted = _curves(ax, table, "normalized_alignment", "noise  Σvᵀ Hv / Σ‖v‖²", "C0", log)
        omitted += _curves(ax, table, "random_curvature", "random  tr(H)/D", "0.55", log)
        if consensus:
            omitted += _curves(ax, table, "consensus_normalized_alignment", "consensus  Σeᵀ He / Σ‖e‖²", "C3", log)
    linear.axhline(0, color="0.5", lw=0.6)
    linear.set_ylabel("normalized alignment")
    logarithmic.set_yscale("log")
    _annotate_omitted(logarithmic, omitted)
    linear.legend(loc="best", frameon=False)
    return _finish(fig, logarithmic, out_dir, "normalized_alignment", "normalized alignment (log)", legend=False)


def _noise_alignment(table, consensus, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    _curves(ax, table, "noise_curvature", "noise  mean vᵀHv", "C0")
    if consensus:
        _curves(ax, table, "consensus_mean_curvature", "consensus  mean eᵀHe", "C3")
    ax.axhline(0, color="0.5", lw=0.6)
    return _finish(fig, ax, out_dir, "noise_alignment", "mean vᵀHv along noise (nats)")


def _training_norms(ax, run_dir: Path, packed: bool) -> None:
    log_path = run_dir / "train-log.jsonl"
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line]
    label = "max worker pre-clipping norm (training)" if packed else "pre-clipping norm (training)"
    ax.plot([r["tokens"] for r in records], [r["grad_norm"] for r in records], color="0.6", lw=0.6, label=label)


def _gradient_norms(table, consensus, out_dir, run_dir: Path | None, packed: bool) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    if run_dir is not None:
        _training_norms(ax, run_dir, packed)
    _curves(ax, table, "mean_grad_norm", "mean ‖gᵢ‖", "C0")
    _curves(ax, table, "mean_noise_norm", "mean ‖vᵢ‖", "C1")
    _curves(ax, table, "full_grad_norm", "‖ḡ‖ (full epoch)", "C2")
    if consensus:
        _curves(ax, table, "consensus_mean_norm", "consensus mean ‖eᵢ‖", "C3")
    ax.set_yscale("log")
    return _finish(fig, ax, out_dir, "gradient_norms", "gradient norm")


def _loss(table, out_dir) -> list[Path]:
    """The epoch loss of every state on seen and unseen data: fit, and the generalisation gap."""
    fig, ax = plt.subplots(figsize=COLUMN)
    if "loss" in table:
        _curves(ax, table, "loss", "epoch loss", "C0")
    return _finish(fig, ax, out_dir, "loss", "token-mean cross-entropy (nats)")


def _batch_sizes(table, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    omitted = _curves(ax, table, "b_simple", "B_simple", "C4", log=True)
    omitted += _curves(ax, table, "b_noise", "B_noise (critical)", "C5", log=True)
    ax.set_yscale("log")
    _annotate_omitted(ax, omitted)
    return _finish(fig, ax, out_dir, "batch_sizes", "batch size (sequences)")


def plot_analysis(analysis_dir: str | Path, out_dir: str | Path | None = None,
                  training_norms: bool = False) -> list[Path]:
    """Draw every figure of an analysis directory (summary.csv + manifest.json); returns the files.

    Raises:
        ValueError: the analysis has no collected results yet.
    """
    analysis_dir = Path(analysis_dir)
    out_dir = Path(out_dir) if out_dir else analysis_dir / "figures"
    if not (analysis_dir / "summary.csv").exists():
        raise ValueError(f"{analysis_dir} has no summary.csv; run the workflow (or collect) first")
    manifest = json.loads((analysis_dir / "manifest.json").read_text())
    table = _states(pd.read_csv(analysis_dir / "summary.csv"))
    consensus = bool(manifest.get("consensus"))
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(manifest["run"]) if training_norms else None
    with plt.rc_context(_RC):
        paths = (_loss(table, out_dir) + _normalized_alignment(table, consensus, out_dir)
                 + _noise_alignment(table, consensus, out_dir)
                 + _gradient_norms(table, consensus, out_dir, run_dir, manifest["packed"])
                 + _batch_sizes(table, out_dir))
    log.info("figures written to %s", out_dir)
    return paths


SPECTRUM_FIGURES = ["top_eigenvalues", "slq_density", "block_diagonal_error"]


def _top_eigenvalues(table, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    columns = sorted(c for c in table.columns if c.startswith("la_eigenvalue_"))
    for i, column in enumerate(columns):
        _curves(ax, table, column, f"λ{i + 1}", f"C{i}")
    return _finish(fig, ax, out_dir, "top_eigenvalues", "top Hessian eigenvalues")


def _slq_density(spectra: list[tuple[int, str, dict]], out_dir, name: str = "slq_density",
                 sigma_fraction: float = 0.01) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    everything = [t for _, _, r in spectra for nodes in r["slq"]["nodes"] for t in nodes]
    low, high = min(everything), max(everything)
    sigma = sigma_fraction * (high - low or 1.0)
    grid = np.linspace(low - 5 * sigma, high + 5 * sigma, 2000)
    cmap = plt.get_cmap("viridis")
    tokens = sorted({t for t, _, _ in spectra})
    for t, case, result in spectra:
        density = np.zeros_like(grid)
        for nodes, weights in zip(result["slq"]["nodes"], result["slq"]["weights"]):
            z = (grid[:, None] - np.array(nodes)[None, :]) / sigma
            density += (np.array(weights)[None, :] * np.exp(-0.5 * z**2)).sum(1) / (sigma * np.sqrt(2 * np.pi))
        density /= len(result["slq"]["nodes"])
        color = cmap(tokens.index(t) / max(1, len(tokens) - 1))
        ax.plot(grid, np.maximum(density, 1e-12), STYLE.get(case, ":"), color=color, lw=0.9, label=f"{t} tokens ({case})")
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-6)
    ax.set_title(f"SLQ density, Gaussian width σ = {sigma:.3g}", loc="left", fontsize=6, color="0.3")
    return _finish(fig, ax, out_dir, name, "spectral density")


def _block_error(table, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    _curves(ax, table, "block_tensor_relative_error", "per tensor", "C0")
    _curves(ax, table, "block_layer_relative_error", "per layer", "C1")
    return _finish(fig, ax, out_dir, "block_diagonal_error", "‖Hv − H_bd v‖ / ‖Hv‖")


def plot_spectrum(analysis_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Spectral figures from spectrum.csv and the saved SLQ nodes (spectra/<key>/<case>.json)."""
    analysis_dir = Path(analysis_dir)
    out_dir = Path(out_dir) if out_dir else analysis_dir / "figures"
    if not (analysis_dir / "spectrum.csv").exists():
        raise ValueError(f"{analysis_dir} has no spectrum.csv; run the workflow with spectrum enabled first")
    table = _states(pd.read_csv(analysis_dir / "spectrum.csv"))
    spectra = [(int(row.tokens), row.case,
                json.loads((analysis_dir / "spectra" / row.state_key / f"{row.case}.json").read_text()))
               for row in table.itertuples()]
    out_dir.mkdir(parents=True, exist_ok=True)
    per_state = out_dir / "slq_states"
    per_state.mkdir(exist_ok=True)
    with plt.rc_context(_RC):
        paths = _top_eigenvalues(table, out_dir) + _slq_density(spectra, out_dir) + _block_error(table, out_dir)
        for key in table["state_key"].unique():  # one density figure per state (both cases)
            mine = [entry for entry, row in zip(spectra, table.itertuples()) if row.state_key == key]
            paths += _slq_density(mine, per_state, name=f"{mine[0][0]:012d}-tokens-{key[:12]}")
    return paths
