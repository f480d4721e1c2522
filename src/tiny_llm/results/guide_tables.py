"""The tables docs/reading-results.md shows of the demo, written from its ``summary.csv`` and
``spectrum.csv`` rows (read as text, as the files hold them), so that the page holds what a run
wrote: the statistics of each state, the step statistics along training, and the optimizer's
geometry beside the preconditioned sharpness with Adam's P as applied and as its next step takes
it. Each is placed between the page's ``<!-- BEGIN tables of <name> -->`` markers
(:mod:`tiny_llm.results.cbs_page`)."""

from __future__ import annotations

import math

__all__ = ["GUIDE_TABLES", "geometry_table", "states_table", "steps_table"]


def _number(text: str, digits: int = 3) -> str:
    if text in ("", None):
        return "null"
    value = float(text)
    if math.isinf(value):
        return "∞"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if 0 < abs(value) < 1e-3:  # fixed point, as the page writes small numbers
        return f"{value:.{digits - 1 - math.floor(math.log10(abs(value)))}f}".replace("-", "−")
    return f"{value:.{digits}g}".replace("-", "−")


def _state(row: dict[str, str], final: bool) -> str:
    """The state's name (initialisation, epoch k, final: the last, or a file such as final.pt) and tokens."""
    named = row["file"].startswith("epoch-")
    epoch = int(row["file"].removeprefix("epoch-").removesuffix(".safetensors")) if named else None
    name = "initialisation" if epoch == 0 else ("final" if final or not named else f"epoch {epoch}")
    return f"{name} ({int(float(row['tokens'])):,} tokens)"


def _seen(summary: list[dict[str, str]]) -> list[dict[str, str]]:
    """The seen case's rows in step order, one per state (a state's aliases, such as the last
    epoch's file and final.pt, are one row: the first)."""
    rows = sorted((r for r in summary if r["case"] == "seen"), key=lambda r: int(r["step"]))
    return list({r["step"]: r for r in reversed(rows)}.values())[::-1]


def states_table(summary: list[dict[str, str]]) -> str:
    """Each state's loss, alignment, tr(H)/D ± se, ḡᵀHḡ, B_simple and B_noise on the seen case."""
    rows = _seen(summary)
    lines = [
        "| state | loss | normalized_alignment | random_curvature (± se) | grad_curvature | b_simple | b_noise |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for index, row in enumerate(rows):
        curvature = f"{_number(row['random_curvature'])} ± {_number(row['random_curvature_se'])}"
        lines.append(
            f"| {_state(row, index == len(rows) - 1)} | {_number(row['loss'], 4)} | "
            f"{_number(row['normalized_alignment'])} | {curvature} | {_number(row['grad_curvature'])} | "
            f"{_number(row['b_simple'])} | {_number(row['b_noise'])} |"
        )
    return "\n".join(lines) + "\n"


def steps_table(summary: list[dict[str, str]]) -> str:
    """Along each step training took (seen case): ḡᵀΔ, the step's sharpness, the optimal step, the
    predicted and the measured loss change."""
    lines = [
        "| from | ḡᵀΔ | ΔᵀHΔ/‖Δ‖² | optimal step | predicted | measured |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in _seen(summary):
        if not row["step_grad_dot"]:
            continue  # the last state: no step after it
        cells = [_number(row[k]) for k in ("step_grad_dot", "step_sharpness", "optimal_step")]
        cells += [_number(row[k]) for k in ("predicted_loss_change", "actual_loss_change")]
        name = _state(row, False).split(" (")[0]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def geometry_table(
    summary: list[dict[str, str]], applied: list[dict[str, str]], following: list[dict[str, str]]
) -> str:
    """Each state with Adam's P (seen): the rate its last step applied, the noise scales plain and
    preconditioned, the best η along −Pḡ, λ_max(PH) with P as applied and as the next step takes it,
    and the threshold (2 + 2β1)/((1 − β1)η)."""

    def by_file(rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
        return {r["file"]: r for r in rows if r["case"] == "seen"}

    spectra, nexts = by_file(applied), by_file(following)
    lines = [
        "| checkpoint | lr | B_simple | B_simple,P | B_noise | B_noise,P | best η along −Pḡ | λ_max(PH), P applied "
        "| λ_max(PH), P of the next step | (2 + 2β1)/((1 − β1)η) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in _seen(summary):
        spectrum, following_row = spectra.get(row["file"], {}), nexts.get(row["file"], {})
        if not row["precond_b_simple"]:
            continue  # no P: the initialisation
        cells = [_number(spectrum.get("lr", ""), 2)]
        cells += [_number(row[k]) for k in ("b_simple", "precond_b_simple", "b_noise", "precond_b_noise")]
        cells += [_number(row["precond_gradient_step"])]
        cells += [_number(r.get("precond_la_eigenvalue_1", "")) for r in (spectrum, following_row)]
        cells += [_number(spectrum.get("stability_threshold", ""))]
        lines.append(f"| {_state(row, False).split(' (')[0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


GUIDE_TABLES = {
    "demo-steps": lambda summary, applied, following: steps_table(summary),
    "demo-geometry": geometry_table,
    "demo-states": lambda summary, applied, following: states_table(summary),
}
"""The page's blocks and how each is written from (summary rows, spectrum rows with P as applied,
spectrum rows with P of the next step)."""
