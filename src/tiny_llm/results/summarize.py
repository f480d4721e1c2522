"""The summary table of an analysis in the terminal, with standard errors and what to watch for.

``summarize(folder)`` reads ``summary.csv`` and ``manifest.json`` (and ``spectrum.csv`` when
present) of a collected analysis and returns text: one row per checkpoint and case with the main
statistics as value ± standard error, then plain-language flags:

* B_noise above the training batch: a larger batch would still shorten training (in steps); and
  B_noise,P, the same in the optimizer's geometry;
* a curvature statistic within one standard error of 0: its sign is not known;
* a precision audit over its threshold: those statistics are not to be used;
* top eigenvalues whose Lanczos iteration did not converge;
* a data order that confounds the batch statistics or the seen/unseen comparison.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from tiny_llm.curvature.statistics import NOISE_BATCHES, STATISTICS
from tiny_llm.layout import MANIFEST, SPECTRUM, SUMMARY
from tiny_llm.results.manifest import integrity_flag

__all__ = ["COLUMNS", "summarize"]

COLUMNS = [(s.name, s.symbol, f"{s.name}_se" if s.sampled else None) for s in STATISTICS if s.symbol]
"""(summary.csv column, header, its standard-error column) of each printed statistic: those whose
declaration gives a terminal symbol, in the declarations' order."""
CURVATURES = {
    "noise_curvature": "noise_samples",
    "normalized_alignment": "noise_samples",
    "random_curvature": "random_samples",
}
"""Curvature statistics whose sign can be unknown -> the setting whose samples would settle it."""


def _number(text: str) -> float | None:
    return None if text in ("", None) else float(text)


def _cell(value: float | None, error: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if not error else f"{value:.3g} ± {error:.2g}"  # error 0: every batch, exact


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.rjust(w) if i > 1 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _name(row: dict[str, str]) -> str:
    """How a row's checkpoint is shown: an imported one by its source directory."""
    return row.get("source") or row["file"]


BATCH_FLAGS = {
    "b_noise": ("B_noise", "a larger batch would still cut the steps to a given loss almost in proportion"),
    "precond_b_noise": (
        "B_noise,P (in the optimizer's geometry)",
        "the critical batch of the optimizer that trained the model is above the batch it used",
    ),
}
"""The critical batch sizes flagged above the training batch: their names and what it means."""


def _above_the_batch(rows: list[dict[str, str]], batch: int | None) -> list[str]:
    """A flag for each critical batch size (plain, and in the optimizer's geometry) above the training batch."""
    flags = []
    for column, (name, meaning) in BATCH_FLAGS.items():
        above = [r for r in rows if batch and (_number(r.get(column)) or 0) > batch]
        if above:
            first = above[0]
            flags.append(
                f"{name} exceeds the training batch of {batch} in {len(above)} of {len(rows)} rows (first: "
                f"{_name(first)} {first['case']}, {name.split(' ')[0]} {float(first[column]):.3g}): {meaning}"
            )
    return flags


def _flags(rows: list[dict[str, str]], manifest: dict[str, Any], spectrum: list[dict[str, str]]) -> list[str]:
    flags = []
    sizes = manifest.get("batch_sizes") or {}
    first_case = sizes.get(manifest["cases"][0], {})
    batch = first_case.get("training_batch_size", first_case.get("effective_batch_size"))  # older: no training batch
    flags += _single_batch(manifest["cases"], sizes)
    flags += _above_the_batch(rows, batch)
    for name, samples in CURVATURES.items():
        unsure = [
            r
            for r in rows
            if _number(r.get(name)) is not None
            and _number(r.get(f"{name}_se")) is not None
            and abs(float(r[name])) <= float(r[f"{name}_se"])
        ]
        if unsure:
            flags.append(
                f"{name} is within one standard error of 0 in {len(unsure)} rows (e.g. {_name(unsure[0])} "
                f"{unsure[0]['case']}): its sign is not known there; raise settings.{samples}"
            )
    audit = manifest.get("audit") or {}
    if audit.get("exceeded"):
        worst = max(audit["exceeded"], key=lambda r: r["relative_error"])
        flags.append(
            f"precision audit: in {len(audit['exceeded'])} rows a statistic's error exceeds "
            f"{audit['threshold']:g} (worst {worst['relative_error']:.2g} at {worst['file']} {worst['case']}: "
            f"{', '.join(worst['statistics'])}); do not use those statistics"
        )
    floor = manifest.get("precision_floor")
    if floor:
        rounding = floor.get("gradient_rounding")
        flags.append(
            f"below float64: the model computes {', '.join(floor['operations'])} below float64 in "
            f"{floor['results']} results"
            + (f" (its gradients rounded to about {rounding:.1e}, relative)" if rounding is not None else "")
            + "; no statistic is more exact than that"
        )
    if integrity := integrity_flag(manifest.get("integrity")):
        flags.append(integrity)
    unconverged = sorted(
        {(_name(r), r["case"]) for r in spectrum if any(v == "False" for k, v in r.items() if "_converged_" in k)}
    )
    if unconverged:
        flags.append(
            f"top eigenvalues did not converge in {len(unconverged)} rows (e.g. {' '.join(unconverged[0])}); "
            "raise spectrum.lanczos_steps"
        )
    flags += [f"data order: {warning}" for warning in manifest.get("data_order_warnings") or []]
    return flags


def _single_batch(cases: list[str], sizes: dict[str, Any]) -> list[str]:
    """The flag of cases measured on a single batch, whose noise cannot be estimated, and of cases
    measured on fewer than :data:`NOISE_BATCHES` batches, whose noise is a rough estimate."""
    batches = {case: (sizes.get(case) or {}).get("epoch_batches") for case in cases}
    single = [case for case, n in batches.items() if n == 1]
    few = {case: n for case, n in batches.items() if n is not None and 1 < n < NOISE_BATCHES}
    flags = []
    if single:
        flags.append(
            f"case {', '.join(single)}: one batch only, so the gradient noise cannot be estimated there (its noise "
            "statistics are 0 by construction, B_simple and B_noise blank); measure a longer epoch or smaller batches"
        )
    if few:
        flags.append(
            f"case {', '.join(f'{case} ({n} batches)' for case, n in few.items())}: fewer than {NOISE_BATCHES} noise "
            "batches, so the noise statistics (B_simple, B_noise, the noise forms) are rough estimates even where "
            "every batch is used (standard error 0 means the whole small population, not an exact value); measure "
            "a longer epoch or window, or smaller noise batches"
        )
    return flags


STUDY = "seeds.csv"
"""A seed study's table (``seed_studies``): its folder holds it instead of a summary.csv."""


def _study(folder: Path) -> str:
    """A seed study's table as text: per case and step, each statistic's mean ± its standard
    deviation over the seeds that gave it (n), and the flags of one-seed points."""
    import pandas as pd

    from tiny_llm.results.seeds import STUDY_STATISTICS

    table = pd.read_csv(folder / STUDY)
    shown = [(n, label) for n, label in STUDY_STATISTICS if f"{n}_mean" in table and table[f"{n}_mean"].notna().any()]
    rows = [["case", "step", "seeds", *(label for _, label in shown)]]
    for _, row in table.iterrows():
        cells = []
        for name, _ in shown:
            mean, std = row[f"{name}_mean"], row[f"{name}_std"]
            cells.append("–" if pd.isna(mean) else f"{mean:.3g}" + ("" if pd.isna(std) else f" ± {std:.2g}"))
        rows.append([row["case"], f"{int(row['step']):,}", str(int(row["seeds"])), *cells])
    seeds = int(table["seeds"].max()) if len(table) else 0
    head = (
        f"seed study {folder.name}: {len(table)} (case, step) rows over up to {seeds} seeds. Values: the mean over "
        "the seeds ± their sample standard deviation (none with one seed); the seeds' own analyses are in "
        "results/<analysis>/ (tiny-llm summarize on each)."
    )
    single = table[table["seeds"] == 1]
    flags = (
        [f"{len(single)} rows were measured by one seed only (n = 1): that seed's value, not a mean"]
        if len(single) and seeds > 1
        else []
    )
    tail = ["", "Flags:", *(f"- {flag}" for flag in flags)] if flags else ["", "No flags."]
    return "\n".join([head, "", _table(rows), *tail])


def summarize(folder: str | Path) -> str:
    """The table and flags of a collected analysis (``results/<name>``), or of a seed study (its
    ``seeds.csv``), as text.

    Raises:
        ValueError: the folder holds no collected analysis, saying how to make one.
    """
    folder = Path(folder)
    summary, manifest_path = folder / SUMMARY, folder / MANIFEST
    if not summary.exists() and (folder / STUDY).exists():
        return _study(folder)
    if not summary.exists() or not manifest_path.exists():
        raise ValueError(
            f"{folder} holds no collected analysis (summary.csv and manifest.json) or seed study (seeds.csv); "
            "run the workflow (snakemake -c1) to make it, or name a folder results/<analysis or study>"
        )
    with open(summary, newline="") as handle:
        rows = list(csv.DictReader(handle))
    manifest = json.loads(manifest_path.read_text())
    spectrum = []
    if (folder / SPECTRUM).exists():
        with open(folder / SPECTRUM, newline="") as handle:
            spectrum = list(csv.DictReader(handle))
    shown = [c for c in COLUMNS if any(r.get(c[0]) not in ("", None) for r in rows)]
    table = [["checkpoint", "case", "step", "tokens", *(header for _, header, _ in shown)]]
    for row in rows:  # an imported checkpoint is named by its source directory
        tokens = f"{int(float(row['tokens'])):,}" if row.get("tokens") not in ("", None) else "unknown"
        step = f"{int(float(row['step'])):,}" if row.get("step") not in ("", None) else "?"
        table.append(
            [
                _name(row),
                row["case"],
                step,
                tokens,
                *(_cell(_number(row.get(name)), _number(row.get(se)) if se else None) for name, _, se in shown),
            ]
        )
    precision = manifest.get("precision") or {}
    head = (
        f"analysis {manifest.get('analysis', folder.name)}: run {manifest.get('run')}, {len(manifest['states'])} "
        f"states × {len(manifest['cases'])} cases; {precision.get('dtype', '?')} on {precision.get('device', '?')}, "
        f"engine {precision.get('engine', '?')}. Values ± one standard error; vᵀHv and vᵀGv are means over noise "
        "directions, align = Σvᵀ Hv/Σ‖v‖². A value without ± has no sampling error: a full-epoch quantity, or every "
        "batch measured (S_v = all)."
    )
    flags = _flags(rows, manifest, spectrum)
    tail = ["", "Flags:", *(f"- {flag}" for flag in flags)] if flags else ["", "No flags."]
    return "\n".join([head, "", _table(table), *tail])
