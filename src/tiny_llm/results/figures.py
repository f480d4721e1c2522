"""Figures from saved results only (summary.csv + manifest.json, optionally the training log).

Every figure plots against training tokens (or optimizer steps: ``x_axis``; steps when a
checkpoint's tokens are unknown), ticks in engineering notation (50k, 1.2M, 3.4B), seen solid and
unseen dashed on shared axes, one point per unique parameter state (aliases are drawn once), with
±1 standard-error bars on sampled statistics; packed runs add the aggregate consensus curve.
Each figure carries the analysis name and its key settings, notes whatever it could not draw
(nulls, values off a log axis, clipped error bars) and keeps its legend below the axes. Written
as PDF and PNG, sized for a paper column.
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from tiny_llm.layout import MANIFEST, SUMMARY, TRAIN_LOG

__all__ = [
    "AUDIT_FIGURES",
    "FIGURES",
    "SPECTRUM_FIGURES",
    "X_AXES",
    "engineering",
    "plot_analysis",
    "plot_audit",
    "plot_spectrum",
]

log = logging.getLogger(__name__)

FIGURES = ["loss", "normalized_alignment", "noise_alignment", "gradient_norms", "batch_sizes"]
AUDIT_FIGURES = ["precision_audit"]
"""Drawn for audited analyses only (``plot_audit``): a float64 analysis has nothing to show there."""
STYLE = {"seen": "-", "unseen": "--"}
COLUMN = (3.5, 2.6)  # inches: one column of a two-column paper
_RC = {
    "font.size": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 6.5,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "lines.linewidth": 1.2,
    "lines.markersize": 3,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "savefig.bbox": "tight",
    "savefig.dpi": 200,
}


X_AXES = ("auto", "tokens", "step")
"""The figures' x-axis: training tokens, optimizer steps, or auto (tokens when all are known)."""


def engineering(value: float, _position: object = None) -> str:
    """A tick label in engineering notation: 0, 800, 50k, 1.2M, 3.4B, 2T.

    Example:
        >>> [engineering(v) for v in (0, 800, 50_000, 1_200_000, 3.4e9, 120_000)]
        ['0', '800', '50k', '1.2M', '3.4B', '120k']
    """
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _states(summary: pd.DataFrame, x_axis: str = "auto") -> pd.DataFrame:
    """One row per (state, case): the earliest alias; column ``x`` holds the x-axis value (tokens
    or steps) and ``attrs["xlabel"]`` its label."""
    if x_axis not in X_AXES:
        raise ValueError(f"plots.x_axis: expected one of {', '.join(X_AXES)}, got {x_axis!r}")
    table = summary.sort_values(["step", "file"]).drop_duplicates(["state_key", "case"]).copy()
    tokens = pd.to_numeric(table["tokens"], errors="coerce") if "tokens" in table else pd.Series(dtype=float)
    known = bool(len(table)) and bool(tokens.notna().all()) and bool((tokens >= 0).all())
    use_tokens = x_axis != "step" and known
    table["x"] = tokens if use_tokens else table["step"].astype(float)
    table.attrs["xlabel"] = "training tokens" if use_tokens else "training step"
    table.attrs["x_note"] = (
        "training tokens unknown for some checkpoints: x-axis in steps" if x_axis == "tokens" and not known else ""
    )
    return table


class Notes:
    """What a figure could not draw as given: values a log axis omits, nulls, clipped error bars.
    Every figure prints its notes under its title, so nothing disappears silently."""

    NULL, OFF_LOG, CUT = "null, omitted", "≤ 0, off the log axis", "error bar cut at a tenth of the value"

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def add(self, kind: str, label: str, count: int) -> None:
        if count:
            labels = self.counts.setdefault(kind, {})
            labels[label] = labels.get(label, 0) + count

    def text(self) -> str:
        parts = [
            f"{kind}: " + ", ".join(f"{label} ×{n}" for label, n in labels.items())
            for kind, labels in self.counts.items()
        ]
        return textwrap.fill("; ".join(parts), width=80)


def _curves(
    ax, table: pd.DataFrame, column: str, label: str, color: str, log: bool = False, notes: Notes | None = None
) -> int:
    """Draw ``column`` per case, with ±1 standard-error bars when ``<column>_se`` is in the table.

    Nulls and (on a log axis) non-positive values are omitted; on a log axis an error bar reaching
    zero or below is cut at a tenth of its value. Each is counted in ``notes``. Returns how many
    values were omitted.
    """
    notes = notes if notes is not None else Notes()
    omitted = 0
    for case, rows in table.groupby("case", sort=False):
        y = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)
        x = (rows["x"] if "x" in rows else rows["tokens"]).to_numpy(dtype=float)
        keep = np.isfinite(y) & (y > 0 if log else True)
        short = f"{label.split('  ')[0]} ({case})"
        notes.add(Notes.NULL, short, int((~np.isfinite(y)).sum()))
        notes.add(Notes.OFF_LOG, short, int((np.isfinite(y) & ~keep).sum()))
        omitted += int((np.isfinite(y) & ~keep).sum())
        if not keep.any():
            continue
        style = dict(linestyle=STYLE.get(case, ":"), marker="o", color=color, label=f"{label} ({case})")
        se_column = f"{column}_se"
        se = (
            pd.to_numeric(rows[se_column], errors="coerce").to_numpy(dtype=float)[keep]
            if se_column in rows
            else np.full(int(keep.sum()), np.nan)
        )
        if np.isfinite(se).any():
            se = np.nan_to_num(se)
            lower = se.copy()
            if log:
                clipped = y[keep] - se <= 0
                lower[clipped] = 0.9 * y[keep][clipped]
                notes.add(Notes.CUT, short, int((clipped & (se > 0)).sum()))
            ax.errorbar(x[keep], y[keep], yerr=[lower, se], capsize=1.5, elinewidth=0.6, **style)
        else:
            ax.plot(x[keep], y[keep], **style)
    return omitted


def _log_axis(ax) -> None:
    """A log y axis with at least three labelled ticks, however narrow the range."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    if high / low < 1e3:  # under three decades: label 1, 2 and 5 of each decade (more under one)
        subs = (1.0, 2.0, 5.0) if high / low > 10 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def _stamp(context: dict) -> str:
    """The analysis name and the settings a reader needs to tell two analyses' figures apart."""
    settings = context.get("settings") or {}
    if not settings:
        return context.get("analysis") or ""
    dtype = settings.get("dtype", "?") + (" + bf16 autocast" if settings.get("amp") else "")
    S_v = settings.get("noise_samples")
    epoch = min((b.get("epoch_batches", 0) for b in (context.get("batch_sizes") or {}).values()), default=0)
    if S_v in (None, "all") or (epoch and S_v >= epoch):  # every batch: the noise statistics are exact
        S_v = f"all {epoch} (exact)" if epoch else "all"
    return f"{context.get('analysis', '')} · {dtype} · S_v = {S_v} · S_r = {settings.get('random_samples')}"


def _finish(
    fig,
    ax,
    out_dir: Path,
    name: str,
    ylabel: str,
    context: dict,
    note: str = "",
    legend_ax=None,
    xlabel: str | None = None,
) -> list[Path]:
    """Label, title (analysis and settings, then the note), a legend below the axes, PDF and PNG;
    x ticks in engineering notation."""
    if xlabel is None:
        for axis in fig.axes:
            axis.xaxis.set_major_formatter(FuncFormatter(engineering))
        note = "; ".join(n for n in (note, context.get("x_note", "")) if n)
    ax.set_xlabel(xlabel or context.get("xlabel", "training tokens"))
    ax.set_ylabel(ylabel)
    top = fig.axes[0]
    title = "\n".join(line for line in (_stamp(context), note) if line)
    if title:
        top.set_title(title, loc="left", fontsize=6, color="0.3")
    handles, labels = (legend_ax or ax).get_legend_handles_labels()
    if handles:  # below the plot: a legend never covers data
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False)
    paths = [out_dir / f"{name}.{ext}" for ext in ("pdf", "png")]
    for path in paths:
        fig.savefig(path)
    plt.close(fig)
    return paths


def _normalized_alignment(table, context, out_dir) -> list[Path]:
    fig, (linear, logarithmic) = plt.subplots(2, 1, sharex=True, figsize=(COLUMN[0], 1.6 * COLUMN[1]))
    notes = Notes()
    for ax, log in ((linear, False), (logarithmic, True)):
        _curves(ax, table, "normalized_alignment", "noise  Σvᵀ Hv / Σ‖v‖²", "C0", log, notes if log else None)
        _curves(ax, table, "random_curvature", "random  tr(H)/D", "0.55", log, notes if log else None)
        if context["consensus"]:
            _curves(
                ax,
                table,
                "consensus_normalized_alignment",
                "consensus  Σeᵀ He / Σ‖e‖²",
                "C3",
                log,
                notes if log else None,
            )
    linear.axhline(0, color="0.5", lw=0.6)
    linear.set_ylabel("normalized alignment (nats)")
    _log_axis(logarithmic)
    return _finish(
        fig,
        logarithmic,
        out_dir,
        "normalized_alignment",
        "normalized alignment (nats, log)",
        context,
        notes.text(),
        legend_ax=linear,
    )


def _noise_alignment(table, context, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    _curves(ax, table, "noise_curvature", "noise  mean vᵀHv", "C0", notes=notes)
    if context["consensus"]:
        _curves(ax, table, "consensus_mean_curvature", "consensus  mean eᵀHe", "C3", notes=notes)
    ax.axhline(0, color="0.5", lw=0.6)
    return _finish(fig, ax, out_dir, "noise_alignment", "mean vᵀHv along noise (nats³)", context, notes.text())


def _training_log(run_dir: Path, context: dict) -> list[dict]:
    """The run's train-log.jsonl records with an x value on the figures' axis; none (and a note in
    ``context``) for a run without one (an imported run: trained elsewhere)."""
    log_path = run_dir / TRAIN_LOG
    if not log_path.exists():
        context["missing_log"] = f"no training log in {run_dir} (trained elsewhere): training curves not drawn"
        return []
    key = "tokens" if context.get("xlabel", "training tokens") == "training tokens" else "step"
    return [r for r in (json.loads(line) for line in log_path.read_text().splitlines() if line) if key in r]


def _log_x(record: dict, context: dict) -> float:
    return record["tokens"] if context.get("xlabel", "training tokens") == "training tokens" else record["step"]


def _training_norms(ax, run_dir: Path, context: dict) -> str:
    """The logged pre-clipping norms behind the measured ones; returns a note when there are none."""
    records = [r for r in _training_log(run_dir, context) if "grad_norm" in r]
    label = "max worker pre-clipping norm (training)" if context["packed"] else "pre-clipping norm (training)"
    if records:
        ax.plot(
            [_log_x(r, context) for r in records], [r["grad_norm"] for r in records], color="0.6", lw=0.6, label=label
        )
    return context.get("missing_log", "")


def _gradient_norms(table, context, out_dir, run_dir: Path | None) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    missing = _training_norms(ax, run_dir, context) if run_dir is not None else ""
    _curves(ax, table, "mean_grad_norm", "mean ‖gᵢ‖", "C0", log=True, notes=notes)
    _curves(ax, table, "mean_noise_norm", "mean ‖vᵢ‖", "C1", log=True, notes=notes)
    _curves(ax, table, "full_grad_norm", "‖ḡ‖ (full epoch)", "C2", log=True, notes=notes)
    if context["consensus"]:
        _curves(ax, table, "consensus_mean_norm", "consensus mean ‖eᵢ‖", "C3", log=True, notes=notes)
    _log_axis(ax)
    note = "; ".join(n for n in (notes.text(), missing) if n)
    return _finish(fig, ax, out_dir, "gradient_norms", "gradient norm (nats)", context, note)


def _training_losses(ax, run_dir: Path, context: dict) -> None:
    """The per-step training loss the run logged (each optimizer batch), behind the epoch losses."""
    records = [r for r in _training_log(run_dir, context) if "loss" in r]
    if records:
        label = "training loss per step (mean over workers)" if context["packed"] else "training loss per step"
        ax.plot(
            [_log_x(r, context) for r in records],
            [r["loss"] for r in records],
            color="0.7",
            lw=0.6,
            label=label,
            zorder=0,
        )


def _loss(table, context, out_dir) -> list[Path]:
    """The epoch loss of every state on seen and unseen data: fit, and the generalisation gap;
    behind them the per-step training loss of the run's log when it is there."""
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    if context.get("run"):
        _training_losses(ax, Path(context["run"]), context)
    if "loss" in table:
        _curves(ax, table, "loss", "epoch loss", "C0", notes=notes)
    note = "; ".join(n for n in (notes.text(), context.pop("missing_log", "")) if n)
    return _finish(fig, ax, out_dir, "loss", "token-mean cross-entropy (nats)", context, note)


def _batch_sizes(table, context, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    _curves(ax, table, "b_simple", "B_simple", "C4", log=True, notes=notes)
    _curves(ax, table, "b_noise", "B_noise (critical)", "C5", log=True, notes=notes)
    trained = {b["effective_batch_size"] for b in (context.get("batch_sizes") or {}).values()}
    for B in sorted(trained):
        ax.axhline(B, color="0.4", lw=0.8, ls=":", label=f"training batch B = {B}")
    _log_axis(ax)
    note = notes.text()
    if Notes.NULL in notes.counts:
        note += " (B_noise is null where ḡᵀHḡ ≤ 0)"
    return _finish(fig, ax, out_dir, "batch_sizes", "batch size (sequences)", context, note)


def _precision_mode(settings: dict, device: str = "") -> str:
    """The arithmetic the analysis ran in; TF32 only where it ran on a CUDA device."""
    dtype = settings.get("dtype", "?")
    device = device or str(settings.get("device", ""))
    extras = [
        name
        for name, on in (
            ("TF32", dtype == "float32" and settings.get("tf32") and device.startswith("cuda")),
            ("bf16 autocast", settings.get("amp")),
        )
        if on
    ]
    return " + ".join([dtype, *extras])


def _precision_audit(table, context, out_dir) -> list[Path]:
    """The largest error a statistic of each state has against float64 (implied by the audit), the
    largest error of a single audited form, and the warning threshold."""
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    column = "audit_statistic_error"
    audited = column in table and pd.to_numeric(table[column], errors="coerce").notna().any()
    if audited:
        mode = _precision_mode(context.get("settings") or {}, (context.get("precision") or {}).get("device", ""))
        _curves(ax, table, column, f"largest statistic error, {mode}", "C0", log=True, notes=notes)
        _curves(ax, table, "audit_max_relative_error", "largest single-form error", "0.6", log=True, notes=notes)
        threshold = (context.get("audit") or {}).get("threshold")
        if threshold:
            ax.axhline(threshold, color="C3", lw=0.8, ls=":", label=f"warning threshold {threshold:g}")
        _log_axis(ax)
    else:
        ax.text(
            0.5,
            0.5,
            "no precision audit\n(float64 analysis, or audit off)",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="0.4",
        )
    return _finish(fig, ax, out_dir, "precision_audit", "relative error against float64", context, notes.text())


def _context(analysis_dir: Path) -> dict:
    """What the figures need from manifest.json (empty when an analysis has none yet)."""
    path = analysis_dir / MANIFEST
    manifest = json.loads(path.read_text()) if path.exists() else {}
    return {
        "analysis": manifest.get("analysis", analysis_dir.name),
        "settings": manifest.get("settings"),
        "batch_sizes": manifest.get("batch_sizes"),
        "consensus": bool(manifest.get("consensus")),
        "packed": bool(manifest.get("packed")),
        "run": manifest.get("run"),
        "audit": manifest.get("audit"),
        "precision": manifest.get("precision"),
    }


def _collected(
    analysis_dir: str | Path, out_dir: str | Path | None, x_axis: str = "auto", table_name: str = SUMMARY
) -> tuple[pd.DataFrame, dict, Path]:
    analysis_dir = Path(analysis_dir)
    out_dir = Path(out_dir) if out_dir else analysis_dir / "figures"
    if not (analysis_dir / table_name).exists():
        raise ValueError(f"{analysis_dir} has no {table_name}; run the workflow (or collect) first")
    table = _states(pd.read_csv(analysis_dir / table_name), x_axis)
    out_dir.mkdir(parents=True, exist_ok=True)
    context = {**_context(analysis_dir), "xlabel": table.attrs["xlabel"], "x_note": table.attrs["x_note"]}
    return table, context, out_dir


def plot_analysis(
    analysis_dir: str | Path,
    out_dir: str | Path | None = None,
    training_norms: bool = False,
    audit: bool = True,
    x_axis: str = "auto",
) -> list[Path]:
    """Draw every figure of an analysis directory (summary.csv + manifest.json), with ``audit``
    the precision audit's too when the analysis was audited; returns the files. The training
    norms (``training_norms``) come from the run's train-log.jsonl; a run without one (imported)
    is drawn without them, with a note.

    Raises:
        ValueError: the analysis has no collected results yet, or an unknown ``x_axis``.
    """
    table, context, out_dir = _collected(analysis_dir, out_dir, x_axis)
    run_dir = Path(context["run"]) if training_norms else None
    with plt.rc_context(_RC):
        paths = (
            _loss(table, context, out_dir)
            + _normalized_alignment(table, context, out_dir)
            + _noise_alignment(table, context, out_dir)
            + _gradient_norms(table, context, out_dir, run_dir)
            + _batch_sizes(table, context, out_dir)
        )
    if audit and ((context.get("audit") or {}).get("audited_rows") or 0) > 0:
        paths += plot_audit(analysis_dir, out_dir, x_axis)
    log.info("figures written to %s", out_dir)
    return paths


def plot_audit(analysis_dir: str | Path, out_dir: str | Path | None = None, x_axis: str = "auto") -> list[Path]:
    """Draw the precision audit's figure of an audited analysis; returns the files.

    Raises:
        ValueError: the analysis has no collected results yet.
    """
    table, context, out_dir = _collected(analysis_dir, out_dir, x_axis)
    with plt.rc_context(_RC):
        return _precision_audit(table, context, out_dir)


SPECTRUM_FIGURES = ["top_eigenvalues", "slq_density", "block_diagonal_error"]


def _top_eigenvalues(table, context, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    columns = sorted(c for c in table.columns if c.startswith("la_eigenvalue_"))
    unconverged = 0
    for i, column in enumerate(columns):
        _curves(ax, table, column, f"λ{i + 1}", f"C{i}", notes=notes)
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
    return _finish(fig, ax, out_dir, "top_eigenvalues", "top Hessian eigenvalues", context, note)


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
            STYLE.get(case, ":"),
            color=color,
            lw=0.9,
            label=f"{engineering(t)} {unit} ({case})",
        )
    ax.set_yscale("log")
    ax.set_ylim(bottom=1e-6)
    return _finish(
        fig,
        ax,
        out_dir,
        name,
        "spectral density",
        context,
        f"SLQ density, Gaussian width σ = {sigma:.3g}",
        xlabel="Hessian eigenvalue",
    )


def _block_error(table, context, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    _curves(ax, table, "block_tensor_relative_error", "per tensor", "C0", notes=notes)
    _curves(ax, table, "block_layer_relative_error", "per layer", "C1", notes=notes)
    return _finish(fig, ax, out_dir, "block_diagonal_error", "‖Hv − H_bd v‖ / ‖Hv‖", context, notes.text())


def plot_spectrum(analysis_dir: str | Path, out_dir: str | Path | None = None, x_axis: str = "auto") -> list[Path]:
    """Spectral figures from spectrum.csv and the saved SLQ nodes (spectra/<key>/<case>.json)."""
    analysis_dir = Path(analysis_dir)
    if not (analysis_dir / "spectrum.csv").exists():
        raise ValueError(f"{analysis_dir} has no spectrum.csv; run the workflow with spectrum enabled first")
    table, context, out_dir = _collected(analysis_dir, out_dir, x_axis, "spectrum.csv")
    spectra = [
        (
            float(row.x),
            row.case,
            json.loads((analysis_dir / "spectra" / row.state_key / f"{row.case}.json").read_text()),
        )
        for row in table.itertuples()
    ]
    per_state = out_dir / "slq_states"
    per_state.mkdir(exist_ok=True)
    with plt.rc_context(_RC):
        paths = (
            _top_eigenvalues(table, context, out_dir)
            + _slq_density(spectra, context, out_dir)
            + _block_error(table, context, out_dir)
        )
        for key in table["state_key"].unique():  # one density figure per state (both cases)
            mine = [entry for entry, row in zip(spectra, table.itertuples(), strict=True) if row.state_key == key]
            unit = "tokens" if context["xlabel"] == "training tokens" else "step"
            paths += _slq_density(mine, context, per_state, name=f"{int(mine[0][0]):012d}-{unit}-{key[:12]}")
    return paths
