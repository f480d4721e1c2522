"""The spectrum's figures, from spectrum.csv and manifest.json alone: the top eigenvalues, the
preconditioned sharpness against the optimizer's stability threshold, the SLQ spectral density of
each state, and the block-diagonal error.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from tiny_llm.layout import SPECTRUM, SPECTRUM_FIGURES
from tiny_llm.results.drawing import COLUMN, RC, STYLE, Notes, collected, curves, engineering, finish

MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*")
"""The marker of each eigenvalue's curve (λ1, λ2, ...): distinct statistics, distinct markers."""

__all__ = ["SPECTRUM_FIGURES", "plot_spectrum"]


def _top_eigenvalues(table, context, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    columns = sorted(c for c in table.columns if c.startswith("la_eigenvalue_"))
    unconverged = 0
    for i, column in enumerate(columns):
        curves(ax, table, column, f"λ{i + 1}", f"C{i}", notes=notes, marker=MARKERS[i % len(MARKERS)])
        flag = column.replace("eigenvalue", "converged")
        bad = table[flag].astype(str) == "False" if flag in table else pd.Series(False, index=table.index)
        if bad.any():
            ax.plot(
                table["x"][bad],
                pd.to_numeric(table[column][bad]),
                "o",
                mfc="none",
                mec="C3",
                ms=9,
                label=None if unconverged else "not converged",
            )
            unconverged += int(bad.sum())
    note = notes.text()
    if unconverged:
        note = (note + "; " if note else "") + f"{unconverged} not converged (red rings): raise spectrum.lanczos_steps"
    return finish(ax, out_dir / "top_eigenvalues", "top Hessian eigenvalues", context, note)


def _preconditioned_sharpness(table, context, out_dir) -> list[Path]:
    """The top eigenvalue of P^{1/2}HP^{1/2} (the preconditioned sharpness λ_max(PH)) against the
    optimizer's stability threshold at each state's learning rate: Adam's (2 + 2β1)/((1 − β1)η),
    SGD's 2(1 + μ)/η; a run at the edge of stability holds the one at the other."""
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    values = pd.to_numeric(table.get("precond_sharpness_over_threshold", pd.Series(dtype=float)), errors="coerce")
    if values.notna().any():
        held = table["preconditioner"].fillna("").astype(str) != ""
        curves(ax, table[held], "precond_la_eigenvalue_1", "λ_max(PH)", "C0", log=True, notes=notes)
        curves(
            ax, table[held], "stability_threshold", "stability threshold", "0.2", log=True, notes=Notes(), marker="s"
        )
        ax.set_yscale("log")
        without = f"{int((~held).sum())} rows without a preconditioner (step 0 has none)" if (~held).any() else ""
        ratio = f"λ_max(PH) / threshold {values.min():.2g} to {values.max():.2g}"
        note = "; ".join(n for n in (ratio, notes.text(), without) if n)
    else:
        note = "no state has the optimizer's preconditioner (each result's preconditioner.reason says why)"
    return finish(ax, out_dir / "preconditioned_sharpness", "preconditioned sharpness", context, note)


def _slq_density(
    spectra: list[tuple[float, str, dict]], context, out_dir, name: str = "slq_density", sigma_fraction: float = 0.01
) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    everything = [t for _, _, r in spectra for nodes in r["slq"]["nodes"] for t in nodes]
    low, high = min(everything), max(everything)
    sigma = sigma_fraction * (high - low or 1.0)
    grid = np.linspace(low - 5 * sigma, high + 5 * sigma, 2000)
    cmap = plt.get_cmap("viridis")  # its dark-to-green part: the yellow end is illegible on white
    positions = sorted({t for t, _, _ in spectra})
    unit = "tokens" if context.get("xlabel", "training tokens") == "training tokens" else "steps"
    for t, case, result in spectra:
        density = np.zeros_like(grid)
        for nodes, weights in zip(result["slq"]["nodes"], result["slq"]["weights"], strict=True):
            z = (grid[:, None] - np.array(nodes)[None, :]) / sigma
            density += (np.array(weights)[None, :] * np.exp(-0.5 * z**2)).sum(1) / (sigma * np.sqrt(2 * np.pi))
        density /= len(result["slq"]["nodes"])
        color = cmap(0.7 * positions.index(t) / max(1, len(positions) - 1))
        ax.plot(
            grid,
            np.maximum(density, 1e-12),
            linestyle=STYLE.get(case, ":"),
            color=color,
            lw=0.9,
            label=f"{engineering(t)} {unit} ({case})",
        )
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-6)
    return finish(
        ax,
        out_dir / name,
        "spectral density",
        context,
        f"SLQ density, Gaussian width σ = {sigma:.3g}",
        xlabel="Hessian eigenvalue",
    )


def _block_error(table, context, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    curves(ax, table, "block_tensor_relative_error", "per tensor", "C0", notes=notes)
    curves(ax, table, "block_layer_relative_error", "per layer", "C1", notes=notes, marker="s")
    return finish(ax, out_dir / "block_diagonal_error", "‖Hv − H_bd v‖ / ‖Hv‖", context, notes.text())


def plot_spectrum(
    analysis_dir: str | Path, out_dir: str | Path | None = None, x_axis: str = "auto", figures: list[str] | None = None
) -> list[Path]:
    """The spectral figures ``figures`` names (None: every one) from spectrum.csv and the saved SLQ
    nodes (spectra/<key>/<case>.json); with slq_density, one density figure per state too."""
    analysis_dir = Path(analysis_dir)
    if not (analysis_dir / SPECTRUM).exists():
        raise ValueError(f"{analysis_dir} has no spectrum.csv; run the workflow with spectrum enabled first")
    table, context, out_dir = collected(analysis_dir, out_dir, x_axis, SPECTRUM)
    spectra = [
        (
            float(row.x),
            row.case,
            json.loads((analysis_dir / "spectra" / row.state_key / f"{row.case}.json").read_text()),
        )
        for row in table.itertuples()
    ]
    drawing = {
        "top_eigenvalues": lambda: _top_eigenvalues(table, context, out_dir),
        "preconditioned_sharpness": lambda: _preconditioned_sharpness(table, context, out_dir),
        "slq_density": lambda: _slq_density(spectra, context, out_dir),
        "block_diagonal_error": lambda: _block_error(table, context, out_dir),
    }
    figures = SPECTRUM_FIGURES if figures is None else figures
    paths = []
    with plt.rc_context(RC):
        for name in figures:
            paths += drawing[name]()
        if "slq_density" not in figures:
            return paths
        per_state = out_dir / "slq_states"
        per_state.mkdir(exist_ok=True)
        for key in table["state_key"].unique():  # one density figure per state (both cases)
            mine = [entry for entry, row in zip(spectra, table.itertuples(), strict=True) if row.state_key == key]
            unit = "tokens" if context["xlabel"] == "training tokens" else "step"
            paths += _slq_density(mine, context, per_state, name=f"{int(mine[0][0]):012d}-{unit}-{key[:12]}")
    return paths
