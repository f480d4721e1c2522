"""Collect per-(state, case) results into manifest.json, summary.csv and blocks.csv, validating
them first.

Nothing is published unless every state has every case, all results share one identity, each
result belongs to its state and case, and every aggregate statistic, the whole model's and each
parameter block's, agrees with its per-sample records (recomputed here). summary.csv has one row
per checkpoint file × case, blocks.csv one per checkpoint file × case × parameter block; nulls are
blank.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiny_llm.curvature.records import Direction
from tiny_llm.curvature.statistics import (
    BLOCK_STANDARD_ERRORS,
    BLOCK_STATISTICS,
    PREFIX,
    STANDARD_ERRORS,
    Samples,
    block_statistics,
    standard_errors,
    summarise,
)
from tiny_llm.curvature.statistics import STATISTICS as DECLARED
from tiny_llm.curvature.trajectory import STEP_STATISTICS, step_statistics
from tiny_llm.io import atomic_write_json, atomic_write_text
from tiny_llm.layout import BLOCKS, MANIFEST, SUMMARY
from tiny_llm.results.manifest import AUDIT_THRESHOLD, audit_block, integrity_block, manifest
from tiny_llm.results.record import append_event, job_records

log = logging.getLogger(__name__)

__all__ = [
    "AUDIT_THRESHOLD",
    "BLOCK_COLUMNS",
    "CONSENSUS_COLUMNS",
    "ERROR_COLUMNS",
    "GAUSS_NEWTON",
    "STATISTICS",
    "cell",
    "csv_text",
    "read_results",
    "SUMMARY_COLUMNS",
    "collect",
    "validate_result",
]

STATISTICS = [s.name for s in DECLARED if s.estimate is not None and s.part_of is None]
"""The statistics every result holds (estimated from its records; the loss aside)."""
GAUSS_NEWTON = [s.name for s in DECLARED if s.part_of is not None]
"""The Gauss–Newton parts of noise_curvature, random_curvature and grad_curvature (form engines)."""
CONSENSUS_COLUMNS = ["consensus_mean_curvature", "consensus_normalized_alignment", "consensus_mean_norm"]
ERROR_COLUMNS = [f"{name}_se" for name in STANDARD_ERRORS]
PRECONDITIONED = [s.name for s in DECLARED if s.estimate is not None]
"""The statistics a result also holds in the optimizer's geometry (all but the loss)."""
PRECONDITIONED_COLUMNS = [f"{PREFIX}{name}" for name in [*PRECONDITIONED, *ERROR_COLUMNS]]
SUMMARY_COLUMNS = [
    "file",
    "state_key",
    "case",
    "step",
    "tokens",
    "source",
    "integrity",
    *(s.name for s in DECLARED),
    *ERROR_COLUMNS,
    "audit_statistic_error",
    "audit_max_relative_error",
    *CONSENSUS_COLUMNS,
    *STEP_STATISTICS,
    "preconditioner",
    *PRECONDITIONED_COLUMNS,
]
"""One row per checkpoint file × case; ``integrity`` names what the checks of a suite trained
elsewhere found of the checkpoint (``identical``, ``final``, ``collapse``, ``spike``; blank: nothing,
or a run trained here), ``loss`` is the epoch loss of the state on the case,
``<statistic>_se`` the standard error of a sampled statistic, ``audit_statistic_error`` the largest
relative error of a statistic that the precision audit implies (loss and ḡ over the whole epoch in
float64, the audited directions rebuilt in float64, in the optimizer's geometry too when the job
measures it) and ``audit_max_relative_error`` the largest
relative error of a single audited quadratic form (blank when null or not audited). The
``*_gauss_newton`` columns are the generalised Gauss–Newton parts of the noise, random and ḡ
forms (blank with the HVP engines). The ``step_*``, ``optimal_step`` and ``*_loss_change`` columns
are the trajectory statistics along the step to the next checkpoint (blank for the last, or with
``trajectory: false``). ``preconditioner`` names the optimizer whose geometry the ``precond_*``
columns are taken in (adamw, or sgd: P = I), blank where the state has none (the result says why);
``precond_<statistic>`` and ``precond_<statistic>_se`` are each statistic in the coordinates
u = P^{-1/2}θ (B_simple,P, B_noise,P, ḡᵀPHPḡ/ḡᵀPḡ as precond_gradient_sharpness, the best step
along −Pḡ as precond_gradient_step)."""

BLOCK_COLUMNS = [
    "file",
    "state_key",
    "case",
    "step",
    "tokens",
    "block",
    "parameters",
    *BLOCK_STATISTICS,
    *(f"{name}_se" for name in BLOCK_STANDARD_ERRORS),
    *STEP_STATISTICS,
    *(f"{PREFIX}{name}" for name in [*BLOCK_STATISTICS, *(f"{n}_se" for n in BLOCK_STANDARD_ERRORS)]),
]
"""One row per checkpoint file × case × parameter block (embedding, each layer's attention and MLP,
norms, an untied head): the block's ‖ḡ_b‖, mean ‖gᵢ,b‖, mean ‖vᵢ,b‖, B_simple and its shares of
‖ḡ‖² and of Σ‖vᵢ‖², and with the block_curvature setting its block-diagonal noise and ḡ forms and
B_noise, with the standard errors of the sampled ones; with block_curvature, the trajectory
statistics along the step restricted to the block (Δ_b); ``precond_*``: the same in the optimizer's
geometry (blank without it)."""


def _agree(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _check_blocks(rows: list[dict[str, Any]], samples: Samples, source: str) -> None:
    """Each parameter block's statistics against its per-sample records."""
    recomputed = block_statistics(
        samples,
        [r["block"] for r in rows],
        [r["parameters"] for r in rows],
        [r["full_grad_norm"] ** 2 for r in rows],
        None if rows[0].get("grad_curvature") is None else [r["grad_curvature"] for r in rows],
    )
    for row, again in zip(rows, recomputed, strict=True):
        for name, value in again.items():
            if name not in row or (name != "block" and not _agree(value, row[name])):
                raise ValueError(
                    f"{source}: block {row['block']}: {name} = {row.get(name)!r} disagrees with its "
                    f"per-sample records ({value!r})"
                )


def _check_statistics(result: dict[str, Any], part: str | None, source: str) -> None:
    """The statistics, standard errors and blocks of a result (or of its block ``part``) against
    their per-sample records."""
    samples = Samples.from_result(result, part)
    taken, where = (result, source) if part is None else (result[part], f"{source}: {part}")
    for block, recomputed in (("statistics", summarise(samples)), ("standard_errors", standard_errors(samples))):
        for name, value in recomputed.items():
            if value is None and name not in taken[block]:  # a statistic added since (Gauss–Newton parts)
                continue
            if name not in taken[block] or not _agree(value, taken[block][name]):
                raise ValueError(
                    f"{where}: {name} = {taken[block].get(name)!r} disagrees with its per-sample records ({value!r})"
                )
    if "blocks" in taken:
        _check_blocks(taken["blocks"], samples, where)


def _check_step(result: dict[str, Any], source: str) -> None:
    """The trajectory statistics against the step's record (ḡᵀΔ, ΔᵀHΔ, ‖Δ‖², the loss at θ')."""
    step = result["trajectory"]
    record = Direction(
        curvature=step["curvature"], gauss_newton=step["gauss_newton"], squared_norm=step["squared_norm"]
    )
    again = step_statistics(step["grad_dot"], record, step["next_loss"] - result["statistics"]["loss"])
    for name, value in again.items():
        if not _agree(value, result["statistics"].get(name)):
            raise ValueError(
                f"{source}: {name} = {result['statistics'].get(name)!r} disagrees with the step's record ({value!r})"
            )


def _check_audit(audit: dict[str, Any], source: str) -> None:
    """The audit's largest errors against its directions and statistics."""
    if not _agree(audit["max_relative_error"], max(d["relative_error"] for d in audit["directions"])):
        raise ValueError(f"{source}: the audit's max_relative_error disagrees with its directions")
    if not _agree(
        audit.get("max_statistic_relative_error"),
        max((v for v in audit.get("statistics_relative_error", {}).values() if v is not None), default=None),
    ):
        raise ValueError(f"{source}: the audit's max_statistic_relative_error disagrees with its statistics")


def validate_result(result: dict[str, Any], key: str, case: str, workers: int | None, source: str) -> None:
    """Check one result's identity, completeness and the consistency of its aggregates.

    Raises:
        ValueError: naming the file and what is wrong.
    """
    if result.get("schema") != 1:
        raise ValueError(f"{source}: unknown result schema {result.get('schema')!r}")
    if result["state"]["key"] != key or result["case"] != case:
        raise ValueError(
            f"{source}: holds state {result['state']['key'][:12]} / {result['case']}, expected {key[:12]} / {case}"
        )
    missing = [k for k in STATISTICS if k not in result["statistics"]]
    if missing:
        raise ValueError(f"{source}: statistics {missing} are missing")
    if "standard_errors" not in result:
        raise ValueError(
            f"{source}: has no standard errors (made by an older version); rerun the workflow in a new output directory"
        )
    for part in (None, "preconditioned") if result.get("preconditioned") else (None,):
        _check_statistics(result, part, source)
    if result.get("trajectory"):
        _check_step(result, source)
    if result.get("audit") is not None:
        _check_audit(result["audit"], source)
    if workers is not None:
        consensus = result.get("consensus")
        if not consensus or [w["worker"] for w in consensus["workers"]] != list(range(workers)):
            raise ValueError(f"{source}: consensus results for workers 0..{workers - 1} are missing")
        q = math.fsum(w["curvature"] for w in consensus["workers"])
        ee = math.fsum(w["squared_norm"] for w in consensus["workers"])
        aggregate = consensus["aggregate"]
        if not (
            _agree(aggregate["mean_curvature"], q / workers)
            and _agree(aggregate["normalized_alignment"], None if ee == 0 else q / ee)
        ):
            raise ValueError(f"{source}: consensus aggregates disagree with the worker records")


def read_results(folder: Path, states: dict[str, Any], cases: list[str]):
    """Yield (state, case, path, result) for every state and case of ``folder/<key>/<case>.json``.

    Raises:
        ValueError: a missing result, naming it.
    """
    for state in states["states"]:
        for case in cases:
            path = folder / state["key"] / f"{case}.json"
            if not path.exists():
                raise ValueError(f"result {path} is missing; rerun the workflow to compute it")
            yield state, case, path, json.loads(path.read_text())


def cell(value: Any) -> Any:
    """A value as a CSV cell (null: blank)."""
    return "" if value is None else value


def csv_text(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """``rows`` as CSV text with ``columns``."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _validated(analysis_dir: Path, states: dict[str, Any], cases: list[str]) -> tuple[dict, dict]:
    """Every (state key, case) result, validated, and their one identity.

    Raises:
        ValueError: a result that is missing, inconsistent, or made with another identity.
    """
    workers = states["workers"] if states["consensus"] else None
    results, identity = {}, None
    for state, case, path, result in read_results(analysis_dir / "states", states, cases):
        validate_result(result, state["key"], case, workers, str(path))
        if identity is None:
            identity = result["identity"]
        elif result["identity"]["hash"] != identity["hash"]:
            raise ValueError(
                f"{path} was computed with another identity (settings, source or device kind) "
                "than the other results; use one output directory per setting"
            )
        results[state["key"], case] = result
    return results, identity


def _rows_per_alias(
    results: dict,
    states: dict[str, Any],
    cases: list[str],
    cells: Callable[[dict[str, Any], dict[str, Any]], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """For every checkpoint file × case, the rows ``cells(result, alias)`` makes, each after the
    file's identifying columns (file, state_key, case, step, tokens); sorted by step (stably)."""
    rows = []
    for state in states["states"]:
        for alias in state["aliases"]:
            for case in cases:
                identity = {
                    "file": alias["file"],
                    "state_key": state["key"],
                    "case": case,
                    "step": alias["step"],
                    "tokens": cell(alias["tokens"]),
                }
                rows.extend(identity | row for row in cells(results[state["key"], case], alias))
    rows.sort(key=lambda r: (r["step"], r["file"], cases.index(r["case"])))
    return rows


def _summary_rows(results: dict, states: dict[str, Any], cases: list[str]) -> list[dict[str, Any]]:
    """One summary.csv row per checkpoint file × case, sorted by step."""

    block = integrity_block(states["run"]) or {}
    flags = {f["checkpoint"]: " ".join(x["kind"] for x in f["findings"]) for f in block.get("flagged", [])}

    def row(result: dict[str, Any], alias: dict[str, Any]) -> list[dict[str, Any]]:
        aggregate = (result.get("consensus") or {}).get("aggregate") or {}
        audit = result.get("audit") or {}
        return [
            {
                "source": alias.get("source", ""),
                "integrity": flags.get(alias["file"], ""),
                **{s.name: cell(result["statistics"].get(s.name)) for s in DECLARED},
                **{k: cell(result["standard_errors"].get(k)) for k in ERROR_COLUMNS},
                "audit_statistic_error": cell(audit.get("max_statistic_relative_error")),
                "audit_max_relative_error": cell(audit.get("max_relative_error")),
                **{c: cell(aggregate.get(c.removeprefix("consensus_"))) for c in CONSENSUS_COLUMNS},
                **{k: cell(result["statistics"].get(k)) for k in STEP_STATISTICS},
                **_preconditioned_cells(result),
            }
        ]

    return _rows_per_alias(results, states, cases, row)


def _preconditioned_cells(result: dict[str, Any]) -> dict[str, Any]:
    """The ``preconditioner`` and ``precond_*`` cells of a result's summary row (blank without)."""
    taken = result.get("preconditioned") or {"statistics": {}, "standard_errors": {}}
    values = {**taken["statistics"], **taken["standard_errors"]}
    optimizer = (result.get("preconditioner") or {}).get("optimizer", "") if result.get("preconditioned") else ""
    return {
        "preconditioner": optimizer,
        **{f"{PREFIX}{k}": cell(values.get(k)) for k in PRECONDITIONED + ERROR_COLUMNS},
    }


def _block_rows(results: dict, states: dict[str, Any], cases: list[str]) -> list[dict[str, Any]]:
    """One blocks.csv row per checkpoint file × case × parameter block (in the result's order), sorted by step."""

    def rows(result: dict[str, Any], alias: dict[str, Any]) -> list[dict[str, Any]]:
        blocks = result.get("blocks", [])
        preconditioned = (result.get("preconditioned") or {}).get("blocks") or [{} for _ in blocks]
        return [
            {c: cell(other.get(c[len(PREFIX) :]) if c.startswith(PREFIX) else block.get(c)) for c in BLOCK_COLUMNS[5:]}
            for block, other in zip(blocks, preconditioned, strict=True)
        ]

    return _rows_per_alias(results, states, cases, rows)


def collect(
    analysis_dir: str | Path,
    states: dict[str, Any],
    cases: list[str],
    name: str,
    audit_threshold: float = AUDIT_THRESHOLD,
) -> dict[str, Any]:
    """Validate ``states/<key>/<case>.json`` for every state and case, then write manifest.json,
    summary.csv and blocks.csv atomically into ``analysis_dir``. Returns the manifest, whose ``audit`` block lists
    the rows whose audited relative error exceeds ``audit_threshold`` (also logged as a warning)."""
    analysis_dir = Path(analysis_dir)
    results, identity = _validated(analysis_dir, states, cases)
    rows = _summary_rows(results, states, cases)
    unknown = sorted({r["source"] or r["file"] for r in rows if r["tokens"] == ""})
    if unknown:
        log.warning(
            "analysis %s: training tokens unknown for %s; the figures use steps (give the tokens with "
            "hf_checkpoints[].tokens or tokens_per_step, or import-hf --tokens)",
            name,
            ", ".join(unknown),
        )
    audit = audit_block(rows, results, name, audit_threshold)
    written = manifest(results, identity, states, cases, name, audit)
    atomic_write_text(analysis_dir / SUMMARY, csv_text(rows, SUMMARY_COLUMNS))
    atomic_write_text(analysis_dir / BLOCKS, csv_text(_block_rows(results, states, cases), BLOCK_COLUMNS))
    atomic_write_json(analysis_dir / MANIFEST, written)
    append_event(
        analysis_dir,
        {
            "event": "collected",
            "source": identity.get("source"),
            "jobs": job_records(name, results),
            "audit_exceeded": len(audit["exceeded"]),
        },
    )
    return written
