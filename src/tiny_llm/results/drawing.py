"""How every figure of an analysis is drawn: the paper-column style, the x-axis (training tokens or
steps, in engineering notation), one curve per case with ±1 standard-error bars, notes of what
could not be drawn, the title with the analysis and its key settings, the legend below the axes,
and the PDF and PNG written; read from the collected files alone (:func:`collected`).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from tiny_llm.curvature.statistics import NOISE_BATCHES
from tiny_llm.layout import MANIFEST, SUMMARY

__all__ = [
    "COLUMN",
    "RC",
    "STYLE",
    "X_AXES",
    "case_style",
    "Notes",
    "collected",
    "figure_context",
    "curves",
    "engineering",
    "finish",
    "stamp",
    "log_axis",
    "states",
    "window_note",
]


STYLE = {"seen": "-", "unseen": "--", "offset": "-.", "recent": ":", "step": (0, (5, 1.5, 1, 1.5, 1, 1.5))}
"""Each case's line style (every case of an analysis its own)."""
SHADE = {"seen": 0.0, "unseen": 0.0, "offset": 0.25, "recent": 0.45, "step": -0.4}
"""How far each case's colour is mixed towards black (negative: towards white)."""
FILL = {"seen": "full", "unseen": "none", "offset": "left", "recent": "bottom", "step": "none"}
"""Each case's marker fill: the case is told by line style, marker fill and shade, the statistic by
colour and marker shape."""


def case_style(case: str, color: str, marker: str = "o") -> dict:
    """The line style, colour and marker of ``case``'s curve of a statistic drawn in ``color`` with
    ``marker`` (unknown cases: dotted)."""
    rgb, shade = np.array(matplotlib.colors.to_rgb(color)), SHADE.get(case, 0.0)
    shaded = rgb * (1 - shade) if shade >= 0 else rgb + (1 - rgb) * -shade
    return dict(
        linestyle=STYLE.get(case, ":"),
        color=tuple(float(c) for c in shaded),
        marker=marker,
        fillstyle=FILL.get(case, "full"),
    )


COLUMN = (3.5, 2.6)  # inches: one column of a two-column paper


RC = {
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
LOG_SPAN = 100
"""Checkpoints whose positive positions span this factor or more are drawn on a log x-axis."""
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


KEY_COLUMNS = ("file", "state_key", "case", "step")
"""The columns every collected table has, which the figures key their rows by."""


def read_table(path: Path, numbers: tuple[str, ...] = (), names: tuple[str, ...] = ()) -> pd.DataFrame:
    """A collected table (summary.csv, blocks.csv), checked before anything is drawn: readable as
    CSV, with the key columns, ``step`` and ``numbers`` numeric, ``file``, ``case`` and ``names`` text.

    Raises:
        ValueError: naming the file, what is wrong with it, and how to make it again.
    """
    again = "collect the analysis again (run the workflow: snakemake -c1)"
    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a collected table ({str(error).splitlines()[0]}); {again}") from None
    missing = [c for c in (*KEY_COLUMNS, *numbers, *names) if c not in table]
    if missing:
        raise ValueError(f"{path} lacks the columns {', '.join(missing)}; {again}")
    bad = [c for c in ("step", *numbers) if not pd.api.types.is_numeric_dtype(table[c])]
    bad += [c for c in ("file", "case", *names) if not all(isinstance(v, str) for v in table[c])]
    if bad:
        raise ValueError(f"{path}: the column {bad[0]} holds values a collected table does not; {again}")
    return table


def states(summary: pd.DataFrame, x_axis: str = "auto") -> pd.DataFrame:
    """One row per (state, case), and per block in a per-block table: the earliest alias; column
    ``x`` holds the x-axis value (tokens or steps) and ``attrs["xlabel"]`` its label."""
    if x_axis not in X_AXES:
        raise ValueError(f"plots.x_axis: expected one of {', '.join(X_AXES)}, got {x_axis!r}")
    keys = ["state_key", "case", *(["block"] if "block" in summary else [])]
    table = summary.sort_values(["step", "file"], kind="stable").drop_duplicates(keys).copy()
    tokens = pd.to_numeric(table["tokens"], errors="coerce") if "tokens" in table else pd.Series(dtype=float)
    known = bool(len(table)) and bool(tokens.notna().all()) and bool((tokens >= 0).all())
    use_tokens = x_axis != "step" and known
    table["x"] = tokens if use_tokens else table["step"].astype(float)
    table.attrs["xlabel"] = "training tokens" if use_tokens else "training step"
    positive = table["x"][table["x"] > 0]
    # log-spaced checkpoints (Pythia's steps 1, 2, 4, ... 512, 1000, ... 143000): a symmetric log axis,
    # linear below the first positive position (step 0 stays at 0)
    table.attrs["x_log"] = bool(len(positive)) and float(positive.max()) >= LOG_SPAN * float(positive.min())
    table.attrs["x_linthresh"] = float(positive.min()) if len(positive) else 1.0
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


def curves(
    ax,
    table: pd.DataFrame,
    column: str,
    label: str,
    color: str,
    log: bool = False,
    notes: Notes | None = None,
    marker: str = "o",
) -> int:
    """Draw ``column`` per case (colour and marker the statistic's, line style, fill and shade the
    case's: :func:`case_style`), with ±1 standard-error bars when ``<column>_se`` is in the table.

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
        short = f"{label.split('  ')[0].lstrip('_')} ({case})"  # an unlisted curve's too
        notes.add(Notes.NULL, short, int((~np.isfinite(y)).sum()))
        notes.add(Notes.OFF_LOG, short, int((np.isfinite(y) & ~keep).sum()))
        omitted += int((np.isfinite(y) & ~keep).sum())
        if not keep.any():
            continue
        style = dict(case_style(case, color, marker), label=f"{label} ({case})")
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


def log_axis(ax) -> None:
    """A log y axis with at least three labelled ticks, however narrow the range."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    if high / low < 1e3:  # under three decades: label 1, 2 and 5 of each decade (more under one)
        subs = (1.0, 2.0, 5.0) if high / low > 10 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


def stamp(context: dict) -> str:
    """The analysis name and the settings a reader needs to tell two analyses' figures apart."""
    settings = context.get("settings") or {}
    if not settings:
        return context.get("analysis") or ""
    dtype = settings.get("dtype", "?") + (" + bf16 autocast" if settings.get("amp") else "")
    S_v = settings.get("noise_samples")
    epoch = min((b.get("epoch_batches", 0) for b in (context.get("batch_sizes") or {}).values()), default=0)
    if S_v in (None, "all") or (epoch and S_v >= epoch):  # every batch: exact, for a population large enough
        S_v = (
            f"all {epoch} ({'exact' if epoch >= NOISE_BATCHES else f'fewer than {NOISE_BATCHES}: rough'})"
            if epoch
            else "all"
        )
    elif epoch and epoch < NOISE_BATCHES:
        S_v = f"{S_v} of {epoch} (fewer than {NOISE_BATCHES}: rough)"
    return f"{context.get('analysis', '')} · {dtype} · S_v = {S_v} · S_r = {settings.get('random_samples')}"


def finish(
    ax,
    path: Path,
    ylabel: str,
    context: dict,
    note: str = "",
    legend_ax=None,
    xlabel: str | None = None,
) -> list[Path]:
    """Label ``ax``, title its figure (analysis and settings, then the note), put a legend below the
    axes, and save it as ``path``.pdf and ``path``.png; x ticks in engineering notation."""
    fig = ax.figure
    if xlabel is None:
        for axis in fig.axes:
            if context.get("x_log"):
                axis.set_xscale("symlog", linthresh=context["x_linthresh"], linscale=0.5)
                axis.set_xlim(left=0)
            axis.xaxis.set_major_formatter(FuncFormatter(engineering))
        notes = (note, context.get("x_note", ""), context.get("window_note", ""), context.get("integrity_note", ""))
        note = "; ".join(n for n in notes if n)
    ax.set_xlabel(xlabel or context.get("xlabel", "training tokens"))
    ax.set_ylabel(ylabel)
    top = fig.axes[0]
    title = "\n".join(line for line in (stamp(context), textwrap.fill(note, 100)) if line)  # about the axes' width
    if title:
        top.set_title(title, loc="left", fontsize=6, color="0.3")
    handles, labels = (legend_ax or ax).get_legend_handles_labels()
    if handles:  # below the plot: a legend never covers data
        fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False)
    paths = [path.with_name(f"{path.name}.{ext}") for ext in ("pdf", "png")]
    for path in paths:
        fig.savefig(path)
    plt.close(fig)
    return paths


def figure_context(analysis_dir: Path) -> dict:
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
        "integrity_note": _integrity_note(manifest.get("integrity")),
        "window_note": window_note(manifest.get("data") or {}),
    }


def window_note(data: dict) -> str:
    """The figures' word on the cases of a training order: each case's window of steps and tokens
    (recent and step: a window of each checkpoint's own, so the reference state's is not shown; each
    result's ``data.window`` gives it)."""
    parts = []
    for case, record in data.items():
        window = (record or {}).get("window")
        if window is None:
            continue
        steps = window["steps"]
        if case == "recent":
            parts.append(f"recent: each checkpoint's own last {steps} step{'s' if steps > 1 else ''}")
        elif case == "step":
            parts.append("step: the steps after each checkpoint, up to the next analysed one (per checkpoint)")
        else:
            parts.append(f"{case}: steps {window['first_step']}–{window['last_step']} ({record['tokens']:,} tokens)")
    return "; ".join(parts)


def _integrity_note(block: dict | None) -> str:
    """The figures' word on a suite's flagged checkpoints (manifest.json's integrity block)."""
    flagged = (block or {}).get("flagged") or []
    if not flagged:
        return ""
    kinds = sorted({x["kind"] for f in flagged for x in f["findings"]})
    steps = ", ".join(str(f["step"]) for f in flagged[:6]) + (", ..." if len(flagged) > 6 else "")
    return f"suite integrity: steps {steps} flagged ({', '.join(kinds)}; manifest.json)"


def collected(
    analysis_dir: str | Path, out_dir: str | Path | None, x_axis: str = "auto", table_name: str = SUMMARY
) -> tuple[pd.DataFrame, dict, Path]:
    """The table of an analysis's collected results (one row per state and case, with its x), the
    figures' context and the folder they go to.

    Raises:
        ValueError: the analysis has no collected table yet, or an unknown ``x_axis``.
    """
    analysis_dir = Path(analysis_dir)
    out_dir = Path(out_dir) if out_dir else analysis_dir / "figures"
    if not (analysis_dir / table_name).exists():
        raise ValueError(f"{analysis_dir} has no {table_name}; run the workflow (or collect) first")
    table = states(read_table(analysis_dir / table_name), x_axis)
    out_dir.mkdir(parents=True, exist_ok=True)
    axis = {k: table.attrs[k] for k in ("xlabel", "x_note", "x_log", "x_linthresh")}
    context = {**figure_context(analysis_dir), **axis}
    return table, context, out_dir
