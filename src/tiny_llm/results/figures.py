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
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from tiny_llm.layout import AUDIT_FIGURES, BLOCKS, FIGURES, TRAIN_LOG, TRAINER_LOG_SOURCE
from tiny_llm.results.drawing import (
    COLUMN,
    RC,
    X_AXES,
    Notes,
    collected,
    curves,
    engineering,
    finish,
    log_axis,
    read_table,
    states,
)
from tiny_llm.results.spectrum_figures import SPECTRUM_FIGURES, plot_spectrum

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


def _normalized_alignment(table, context, out_dir) -> list[Path]:
    fig, (linear, logarithmic) = plt.subplots(2, 1, sharex=True, figsize=(COLUMN[0], 1.6 * COLUMN[1]))
    notes = Notes()
    for ax, log in ((linear, False), (logarithmic, True)):
        curves(ax, table, "normalized_alignment", "noise  Σvᵀ Hv / Σ‖v‖²", "C0", log, notes if log else None)
        curves(ax, table, "random_curvature", "random  tr(H)/D", "0.55", log, notes if log else None, "s")
        if context["consensus"]:
            curves(
                ax,
                table,
                "consensus_normalized_alignment",
                "consensus  Σeᵀ He / Σ‖e‖²",
                "C3",
                log,
                notes if log else None,
                "D",
            )
    linear.axhline(0, color="0.5", lw=0.6)
    linear.set_ylabel("normalized alignment (nats)")
    log_axis(logarithmic)
    return finish(
        logarithmic,
        out_dir / "normalized_alignment",
        "normalized alignment (nats, log)",
        context,
        notes.text(),
        legend_ax=linear,
    )


def _noise_alignment(table, context, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    curves(ax, table, "noise_curvature", "noise  mean vᵀHv", "C0", notes=notes)
    if context["consensus"]:
        curves(ax, table, "consensus_mean_curvature", "consensus  mean eᵀHe", "C3", notes=notes, marker="s")
    ax.axhline(0, color="0.5", lw=0.6)
    return finish(ax, out_dir / "noise_alignment", "mean vᵀHv along noise (nats³)", context, notes.text())


def _training_log(run_dir: Path, context: dict) -> list[dict]:
    """The run's train-log.jsonl records with an x value on the figures' axis; none (and a note in
    ``context``) for a run without one (imported from checkpoints without a Trainer's log)."""
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
    if records and records[0].get("source") == TRAINER_LOG_SOURCE:
        label = "pre-clipping norm (the Trainer's log)"
    if records:
        ax.plot(
            [_log_x(r, context) for r in records], [r["grad_norm"] for r in records], color="0.6", lw=0.6, label=label
        )
    return context.get("missing_log", "")


def _gradient_norms(table, context, out_dir, run_dir: Path | None) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    missing = _training_norms(ax, run_dir, context) if run_dir is not None else ""
    curves(ax, table, "mean_grad_norm", "mean ‖gᵢ‖", "C0", log=True, notes=notes)
    curves(ax, table, "mean_noise_norm", "mean ‖vᵢ‖", "C1", log=True, notes=notes, marker="s")
    curves(ax, table, "full_grad_norm", "‖ḡ‖ (full epoch)", "C2", log=True, notes=notes, marker="D")
    if context["consensus"]:
        curves(ax, table, "consensus_mean_norm", "consensus mean ‖eᵢ‖", "C3", log=True, notes=notes, marker="^")
    log_axis(ax)
    note = "; ".join(n for n in (notes.text(), missing) if n)
    return finish(ax, out_dir / "gradient_norms", "gradient norm (nats)", context, note)


def _training_losses(ax, run_dir: Path, context: dict) -> None:
    """The per-step training loss the run logged (each optimizer batch; an imported Trainer's log:
    its logging intervals), behind the epoch losses."""
    records = [r for r in _training_log(run_dir, context) if "loss" in r]
    if records:
        label = "training loss per step (mean over workers)" if context["packed"] else "training loss per step"
        if records[0].get("source") == TRAINER_LOG_SOURCE:
            label = "training loss (the Trainer's log: mean over its logging interval)"
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
        curves(ax, table, "loss", "epoch loss", "C0", notes=notes)
    note = "; ".join(n for n in (notes.text(), context.pop("missing_log", "")) if n)
    return finish(ax, out_dir / "loss", "token-mean cross-entropy (nats)", context, note)


def _batch_sizes(table, context, out_dir) -> list[Path]:
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    curves(ax, table, "b_simple", "B_simple", "C4", log=True, notes=notes)
    curves(ax, table, "b_noise", "B_noise (critical)", "C5", log=True, notes=notes, marker="s")
    trained = {b.get("training_batch_size", b["effective_batch_size"]) for b in _batch_records(context)}  # older: none
    for B in sorted(trained):
        ax.axhline(B, color="0.4", lw=0.8, ls=":", label=f"training batch B = {B}")
    log_axis(ax)
    note = notes.text()
    if Notes.NULL in notes.counts:
        note += " (B_noise is null where ḡᵀHḡ ≤ 0)"
    single = [case for case, b in (context.get("batch_sizes") or {}).items() if b.get("epoch_batches") == 1]
    if single:
        note += f"; {', '.join(single)}: one batch, no noise estimate"
    return finish(ax, out_dir / "batch_sizes", "batch size (sequences)", context, note)


def _preconditioned_batch_sizes(table, context, out_dir) -> list[Path]:
    """B_simple,P and B_noise,P, the noise scales in the optimizer's geometry, beside the plain ones
    (McCandlish et al.'s B_noise predicts the critical batch of plain SGD; B_noise,P that of a step
    −ηPg with the state's P), and the training batch."""
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    curves(ax, table, "b_simple", "B_simple", "C4", log=True, notes=notes)
    curves(ax, table, "b_noise", "B_noise", "C5", log=True, notes=notes, marker="s")
    held = (
        table["preconditioner"].fillna("").astype(str) != "" if "preconditioner" in table else table["x"] != table["x"]
    )
    if held.any():
        curves(ax, table[held], "precond_b_simple", "B_simple,P", "C0", log=True, notes=notes, marker="v")
        curves(ax, table[held], "precond_b_noise", "B_noise,P", "C3", log=True, notes=notes, marker="D")
    for B in sorted({b.get("training_batch_size", b["effective_batch_size"]) for b in _batch_records(context)}):
        ax.axhline(B, color="0.4", lw=0.8, ls=":", label=f"training batch B = {B}")
    log_axis(ax)
    without = int((~held).sum())
    note = "; ".join(
        n
        for n in (
            notes.text(),
            "P: the optimizer's preconditioner at the state (Adam: 1/(√v̂ + ε))",
            f"{without} rows without one (step 0 has no second moment; see each result's preconditioner)"
            if without
            else "",
        )
        if n
    )
    return finish(ax, out_dir / "preconditioned_batch_sizes", "batch size (sequences)", context, note)


def _batch_records(context: dict) -> list[dict]:
    """The batch sizes each case was measured with (from the manifest)."""
    return list((context.get("batch_sizes") or {}).values())


def _step_sharpness(table, context, out_dir) -> list[Path]:
    """The directional sharpness along the step training took, ΔᵀHΔ/‖Δ‖², beside the one along the
    gradient, ḡᵀHḡ/‖ḡ‖², at each checkpoint with a successor."""
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    table = table.assign(
        grad_sharpness=pd.to_numeric(table["grad_curvature"], errors="coerce") / table["full_grad_norm"] ** 2
    )
    curves(ax, table, "step_sharpness", "ΔᵀHΔ/‖Δ‖² (the step)", "C3", notes=notes)
    curves(ax, table, "grad_sharpness", "ḡᵀHḡ/‖ḡ‖² (the gradient)", "C0", notes=notes, marker="s")
    ax.axhline(0, color="0.6", lw=0.6)
    note = "the last checkpoint has no successor (not drawn)"
    return finish(ax, out_dir / "step_sharpness", "directional sharpness", context, note)


def _step_loss(table, context, out_dir) -> list[Path]:
    """The loss change from each checkpoint to the next: measured at the next one on the same epoch,
    and what the quadratic model at this one predicts (ḡᵀΔ + ½ΔᵀHΔ)."""
    fig, ax = plt.subplots(figsize=COLUMN)
    notes = Notes()
    curves(ax, table, "actual_loss_change", "measured L(θ') − L(θ)", "C2", notes=notes)
    curves(ax, table, "predicted_loss_change", "quadratic model ḡᵀΔ + ½ΔᵀHΔ", "C1", notes=notes, marker="s")
    ax.axhline(0, color="0.6", lw=0.6)
    note = "the last checkpoint has no successor (not drawn)"
    values = [pd.to_numeric(table[c], errors="coerce") for c in ("actual_loss_change", "predicted_loss_change")]
    sizes = pd.concat(values).abs()
    sizes = sizes[np.isfinite(sizes) & (sizes > 0)]
    if len(sizes) and sizes.max() > 30 * sizes.min():  # an early step's change would flatten the rest
        ax.set_yscale("symlog", linthresh=float(sizes.min()), linscale=0.5)
        note += f"; symmetric log axis, linear within ±{float(sizes.min()):.2g}"
    return finish(ax, out_dir / "step_loss", "loss change to the next checkpoint (nats)", context, note)


BLOCK_COLOURS = {"embedding": "C4", "norms": "0.5", "head": "C2"}
"""Colours of the blocks that are not layers; a layer's attention is blue and its MLP orange, light
to dark with depth."""


def _block_style(name: str, layers: int) -> tuple[Any, str]:
    """(colour, legend label) of block ``name`` of a model with ``layers`` layers: with more than
    four layers only the first and the last of each kind are in the legend (the others' labels start
    with an underscore, which matplotlib leaves out)."""
    if not name.startswith("layer "):
        return BLOCK_COLOURS.get(name, "C5"), name
    _, index, kind = name.split()
    depth = 0.35 + 0.6 * int(index) / max(1, layers - 1)
    colour = plt.get_cmap("Blues" if kind == "attention" else "Oranges")(depth)
    shown = layers <= 4 or int(index) in (0, layers - 1)
    return colour, name if shown else f"_{name}"


def _blocks_table(analysis_dir: Path, x_axis: str) -> pd.DataFrame | None:
    """blocks.csv, checked (None for an analysis collected before it existed)."""
    if not (analysis_dir / BLOCKS).exists():
        return None
    return states(read_table(analysis_dir / BLOCKS, numbers=("b_simple",), names=("block",)), x_axis)


def _block_batch_sizes(whole, context, out_dir, table: pd.DataFrame | None) -> list[Path]:
    """B_simple of each parameter block (blocks.csv) against the whole model's (``whole``, the
    summary's table): layers' attention in blues and MLPs in oranges, light to dark with depth; an
    analysis collected before blocks.csv existed gets a note instead of curves."""
    fig, ax = plt.subplots(figsize=(COLUMN[0], 1.3 * COLUMN[1]))
    notes = Notes()
    note = ""
    if table is not None and len(table):
        names = list(dict.fromkeys(table["block"]))
        layers = len({n.split()[1] for n in names if n.startswith("layer ")})
        for name in names:
            colour, label = _block_style(name, layers)
            curves(ax, table[table["block"] == name], "b_simple", label, colour, log=True, notes=notes)
        if layers > 4:
            note = f"{layers} layers: legend shows the first and the last of each kind"
    else:
        note = "no per-block table (collected before blocks.csv existed)"
    curves(ax, whole, "b_simple", "whole model", "k", log=True, notes=notes, marker="s")
    log_axis(ax)
    note = "; ".join(n for n in (note, notes.text()) if n)
    return finish(ax, out_dir / "block_batch_sizes", "B_simple per block (sequences)", context, note)


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
        curves(ax, table, column, f"largest statistic error, {mode}", "C0", log=True, notes=notes)
        curves(
            ax, table, "audit_max_relative_error", "largest single-form error", "0.6", log=True, notes=notes, marker="s"
        )
        threshold = (context.get("audit") or {}).get("threshold")
        if threshold:
            ax.axhline(threshold, color="C3", lw=0.8, ls=":", label=f"warning threshold {threshold:g}")
        log_axis(ax)
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
    return finish(ax, out_dir / "precision_audit", "relative error against float64", context, notes.text())


def plot_analysis(
    analysis_dir: str | Path,
    out_dir: str | Path | None = None,
    training_norms: bool = False,
    audit: bool = True,
    x_axis: str = "auto",
    figures: list[str] | None = None,
) -> list[Path]:
    """Draw the figures of an analysis directory (summary.csv + manifest.json) that ``figures``
    names (None: every one), with ``audit`` the precision audit's too when the analysis was audited;
    returns the files. The training norms (``training_norms``) come from the run's train-log.jsonl;
    a run without one (imported) is drawn without them, with a note.

    Raises:
        ValueError: the analysis has no collected results yet, a collected table that is not one
            (named), or an unknown ``x_axis``; no figure is drawn then.
    """
    blocks = _blocks_table(Path(analysis_dir), x_axis)  # both tables checked before anything is made
    table, context, out_dir = collected(analysis_dir, out_dir, x_axis)
    run_dir = Path(context["run"]) if training_norms else None
    drawing = {
        "loss": lambda: _loss(table, context, out_dir),
        "normalized_alignment": lambda: _normalized_alignment(table, context, out_dir),
        "noise_alignment": lambda: _noise_alignment(table, context, out_dir),
        "gradient_norms": lambda: _gradient_norms(table, context, out_dir, run_dir),
        "batch_sizes": lambda: _batch_sizes(table, context, out_dir),
        "preconditioned_batch_sizes": lambda: _preconditioned_batch_sizes(table, context, out_dir),
        "block_batch_sizes": lambda: _block_batch_sizes(table, context, out_dir, blocks),
        "step_sharpness": lambda: _step_sharpness(table, context, out_dir),
        "step_loss": lambda: _step_loss(table, context, out_dir),
    }
    paths = []
    with plt.rc_context(RC):
        for name in FIGURES if figures is None else figures:
            paths += drawing[name]()
    if audit and ((context.get("audit") or {}).get("audited_rows") or 0) > 0:
        paths += plot_audit(analysis_dir, out_dir, x_axis)
    log.info("figures written to %s", out_dir)
    return paths


def plot_audit(analysis_dir: str | Path, out_dir: str | Path | None = None, x_axis: str = "auto") -> list[Path]:
    """Draw the precision audit's figure of an audited analysis; returns the files.

    Raises:
        ValueError: the analysis has no collected results yet.
    """
    table, context, out_dir = collected(analysis_dir, out_dir, x_axis)
    with plt.rc_context(RC):
        return _precision_audit(table, context, out_dir)
