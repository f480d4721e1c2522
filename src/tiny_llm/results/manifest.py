"""The manifest of a collected analysis (manifest.json): the analysis, its identity and settings,
the precision audit's block (the rows whose implied statistic error exceeds a threshold), the
precision floor of a float64 analysis whose model computes some operation below float64, the
integrity of a suite trained elsewhere (what its import found), what ran where, the data of each
case and every state with its results."""

from __future__ import annotations

import json
import logging
from typing import Any

from tiny_llm.data.order import order_warnings
from tiny_llm.model.hf_runs import imported_record

__all__ = ["AUDIT_THRESHOLD", "audit_block", "integrity_block", "integrity_flag", "manifest", "precision_floor"]

log = logging.getLogger(__name__)

AUDIT_THRESHOLD = 1e-2
"""Default largest implied statistic error collection accepts without a warning."""


def audit_block(rows: list[dict], results: dict, name: str, audit_threshold: float) -> dict[str, Any]:
    """The manifest's audit block: the rows whose implied statistic error exceeds the threshold
    (with a warning naming the worst)."""
    audited = [r for r in rows if r["audit_statistic_error"] != ""]
    exceeded = []
    for row in audited:
        if row["audit_statistic_error"] > audit_threshold:
            errors = results[row["state_key"], row["case"]]["audit"]["statistics_relative_error"]
            exceeded.append(
                {
                    "file": row["file"],
                    "case": row["case"],
                    "relative_error": row["audit_statistic_error"],
                    "statistics": sorted(k for k, v in errors.items() if v is not None and v > audit_threshold),
                }
            )
    if exceeded:
        worst = max(exceeded, key=lambda r: r["relative_error"])
        log.warning(
            "analysis %s: in %d of %d audited rows a statistic's implied error exceeds the audit threshold %g "
            "(worst %.3g at %s %s: %s); see 'Precision audit' in docs/reading-results.md before using these "
            "numbers",
            name,
            len(exceeded),
            len(audited),
            audit_threshold,
            worst["relative_error"],
            worst["file"],
            worst["case"],
            ", ".join(worst["statistics"]),
        )
    return {
        "threshold": audit_threshold,
        "audited_rows": len(audited),
        "exceeded": exceeded,
        "max_statistic_error": max((r["audit_statistic_error"] for r in audited), default=None),
        "max_relative_error": max((r["audit_max_relative_error"] for r in audited), default=None),
    }


def precision_floor(results: dict) -> dict[str, Any] | None:
    """The manifest's precision floor block: where a float64 analysis's model computes some operation
    below float64 (an adapter's model whose code defeats its float64 mode), the operations, the
    largest measured rounding of the gradient (``gradient_rounding``) and how many results carry it;
    None where every result is float64 throughout."""
    below = [r["precision"] for r in results.values() if r["precision"].get("below_float64")]
    if not below:
        return None
    measured = [p["gradient_rounding"] for p in below if p.get("gradient_rounding") is not None]
    return {
        "operations": sorted({op for p in below for op in p["below_float64"]}),
        "gradient_rounding": max(measured, default=None),
        "results": len(below),
    }


def integrity_block(run: str) -> dict[str, Any] | None:
    """The manifest's integrity block of an imported suite: how many checkpoints were checked, each
    one's distance from the first, and those flagged with what was found
    (:mod:`tiny_llm.model.integrity`); None for a run trained here or imported before the checks."""
    record = imported_record(run)
    checkpoints = (record or {}).get("checkpoints") or []
    if not checkpoints or any("integrity" not in c for c in checkpoints):
        return None
    flagged = [
        {
            "checkpoint": c["checkpoint"],
            "source": c.get("revision") or c["source"],
            "step": c["step"],
            "findings": c["integrity"],
        }
        for c in checkpoints
        if c["integrity"]
    ]
    distances = {c["checkpoint"]: c["distance_from_first"] for c in checkpoints}
    return {"checked": len(checkpoints), "flagged": flagged, "distance_from_first": distances}


def integrity_flag(block: dict[str, Any] | None) -> str | None:
    """``summarize``'s flag of a suite's flagged checkpoints (an integrity block); None when none is."""
    flagged = (block or {}).get("flagged") or []
    if not flagged:
        return None
    shown = "; ".join(
        f"{f['source']} (step {f['step']}): {', '.join(x['detail'] for x in f['findings'])}" for f in flagged[:3]
    )
    return (
        f"suite integrity: {len(flagged)} of {block['checked']} checkpoints flagged ({shown}"
        f"{'; ...' if len(flagged) > 3 else ''}); their statistics are not those of the steps they are named for"
    )


BATCH_SIZES = (
    "training_batch_size",
    "effective_batch_size",
    "micro_batch_size",
    "hvp_batch_size",
    "directions_per_pass",
    "epoch_batches",
    "epoch_tokens",
    "parameters_D",
)
"""The counts of a result the manifest lists per case."""


def _batch_sizes(counts: dict[str, Any]) -> dict[str, Any]:
    """A result's counts the manifest lists (those it has: older results lack the training batch)."""
    return {k: counts[k] for k in BATCH_SIZES if k in counts}


def manifest(results: dict, identity: dict, states: dict, cases: list[str], name: str, audit: dict) -> dict:
    """manifest.json: the analysis, its identity and settings, the audit block, what ran where, the
    data of each case and every state with its results."""
    first, reference = next(iter(results.values())), states["states"][0]["key"]
    order = order_warnings({case: results[reference, case]["data"].get("order") for case in cases})
    for warning in order:
        log.warning("analysis %s: data order: %s", name, warning)
    return {
        "format": 1,
        "analysis": name,
        "run": states["run"],
        "cases": cases,
        "packed": states["packed"],
        "workers": states["workers"],
        "consensus": states["consensus"],
        "identity": identity,
        "settings": first["settings"],
        "precision": first["precision"],
        "audit": audit,
        "precision_floor": precision_floor(results),
        "integrity": integrity_block(states["run"]),
        "software": first["software"],
        "hardware": list({json.dumps(r["hardware"], sort_keys=True): r["hardware"] for r in results.values()}.values()),
        "slurm_jobs": [r["slurm"] | {"state": k[:12], "case": c} for (k, c), r in results.items() if r.get("slurm")],
        "data": {case: results[reference, case]["data"] for case in cases},
        "data_order_warnings": order,
        "batch_sizes": {case: _batch_sizes(results[reference, case]["counts"]) for case in cases},
        "states": [
            {
                **state,
                "results": {case: f"states/{state['key']}/{case}.json" for case in cases},
                "worker_files": results[state["key"], cases[0]]["state"].get("worker_files"),
            }
            for state in states["states"]
        ],
    }
