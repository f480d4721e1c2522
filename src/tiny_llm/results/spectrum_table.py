"""spectrum.csv: one row per checkpoint file × case from the spectrum results
(``spectra/<key>/<case>.json``): the top eigenvalues with their residuals and convergence, the SLQ
moments, the alignments, the damped solve, the block-diagonal errors and, in the optimizer's
geometry, the top eigenvalues of P^{1/2}HP^{1/2} beside the learning rate and the stability
threshold of the state's step."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tiny_llm.io import atomic_write_text
from tiny_llm.layout import SPECTRUM
from tiny_llm.results.collect import cell, csv_text, read_results

__all__ = ["collect_spectrum"]

log = logging.getLogger(__name__)


def _spectrum_row(result: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for which, key in (("la", "top_eigenvalues"), ("lm", "top_magnitude_eigenvalues")):
        for pair in result[key]:
            row[f"{which}_eigenvalue_{pair['index'] + 1}"] = pair["eigenvalue"]
            row[f"{which}_residual_{pair['index'] + 1}"] = pair["residual"]
            row[f"{which}_converged_{pair['index'] + 1}"] = cell(pair.get("converged"))
    row["trace_over_D"] = result["slq"]["trace_over_D"]
    row["second_moment_over_D"] = result["slq"]["second_moment_over_D"]
    alignment = result["alignment"]
    row["gradient_top1_alignment"] = alignment["gradient_top"][0]
    noise = alignment["noise_top_mean"]
    row["noise_top1_alignment"] = cell(noise[0] if noise else None)
    row["gradient_top_share"] = cell(alignment.get("gradient_top_share"))  # older results lack the shares
    step = alignment.get("step_top")
    row["step_top1_alignment"] = cell(step[0] if step else None)
    row["step_top_share"] = cell(alignment.get("step_top_share"))
    cg = result["cg"]
    row.update(
        cg_damping=cg["damping"],
        cg_status=cg["status"],
        cg_iterations=cell(cg["iterations"]),
        cg_relative_residual=cell(cg["relative_residual"]),
        g_inverse_g=cell(cg["g_inverse_g"]),
    )
    for kind, block in result["block_diagonal"].items():
        row[f"block_{kind}_relative_error"] = block["mean_relative_error"]
        row[f"block_{kind}_cosine"] = block["mean_cosine"]
    return row | _preconditioned_spectrum(result)


def _preconditioned_spectrum(result: dict[str, Any]) -> dict[str, Any]:
    """The spectrum row's preconditioned sharpness beside the learning rate and the stability
    threshold of the step (blank where the state has no preconditioner): ``precond_la_*`` the top
    eigenvalues of P^{1/2}HP^{1/2}, and their largest over the threshold."""
    record, top = result.get("preconditioner") or {}, result.get("preconditioned") or {}
    row: dict[str, Any] = {"preconditioner": record.get("optimizer", "") if top else ""}
    pairs = top.get("top_eigenvalues") or [{"index": i} for i in range(len(result["top_eigenvalues"]))]
    for pair in pairs:
        row[f"precond_la_eigenvalue_{pair['index'] + 1}"] = cell(pair.get("eigenvalue"))
        row[f"precond_la_converged_{pair['index'] + 1}"] = cell(pair.get("converged"))
    threshold = record.get("stability_threshold") if top else None
    sharpness = pairs[0].get("eigenvalue")
    row.update(
        lr=cell(record.get("lr") if top else None),
        stability_threshold=cell(threshold),
        precond_sharpness_over_threshold=cell(
            None if threshold is None or sharpness is None else sharpness / threshold
        ),
    )
    return row


def collect_spectrum(analysis_dir: str | Path, states: dict[str, Any], cases: list[str]) -> list[dict[str, Any]]:
    """Write spectrum.csv (one row per checkpoint file × case) from spectra/<key>/<case>.json."""
    analysis_dir = Path(analysis_dir)
    rows, identity = [], None
    for state, case, path, result in read_results(analysis_dir / "spectra", states, cases):
        if result["state"]["key"] != state["key"] or result["case"] != case:
            raise ValueError(f"{path} holds another state or case")
        if identity is not None and result["identity"]["hash"] != identity:
            raise ValueError(f"{path} was computed with another identity than the other spectra")
        identity = result["identity"]["hash"]
        values = _spectrum_row(result)
        for alias in state["aliases"]:
            rows.append(
                {
                    "file": alias["file"],
                    "state_key": state["key"],
                    "case": case,
                    "step": alias["step"],
                    "tokens": cell(alias["tokens"]),
                    "source": alias.get("source", ""),
                    **values,
                }
            )
    rows.sort(key=lambda r: (r["step"], r["file"], cases.index(r["case"])))
    atomic_write_text(analysis_dir / SPECTRUM, csv_text(rows, list(rows[0])))
    unconverged = sorted(
        {(r["file"], r["case"]) for r in rows if any(v is False for k, v in r.items() if "_converged_" in k)}
    )
    if unconverged:
        log.warning(
            "analysis %s: top eigenvalues of %d (state, case) rows did not converge (%s); their "
            "*_converged_* cells in spectrum.csv are False: raise spectrum.lanczos_steps",
            analysis_dir.name,
            len(unconverged),
            ", ".join(f"{f} {c}" for f, c in unconverged[:4]) + (" ..." if len(unconverged) > 4 else ""),
        )
    return rows
