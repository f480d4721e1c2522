"""Collect per-(state, case) results into manifest.json and summary.csv, validating them first.

Nothing is published unless every state has every case, all results share one identity, each
result belongs to its state and case, and every aggregate statistic agrees with its per-sample
records (recomputed here). summary.csv has one row per checkpoint file × case; nulls are blank.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from tiny_llm.io import atomic_write_json, atomic_write_text
from tiny_llm.noise import summarise

__all__ = ["CONSENSUS_COLUMNS", "STATISTICS", "SUMMARY_COLUMNS", "collect", "validate_result"]

STATISTICS = ["noise_curvature", "normalized_alignment", "mean_noise_norm", "mean_grad_norm", "full_grad_norm",
              "random_curvature", "grad_curvature", "b_simple", "b_noise"]
CONSENSUS_COLUMNS = ["consensus_mean_curvature", "consensus_normalized_alignment", "consensus_mean_norm"]
SUMMARY_COLUMNS = ["file", "state_key", "case", "step", "tokens", *STATISTICS, *CONSENSUS_COLUMNS]


def _agree(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def validate_result(result: dict[str, Any], key: str, case: str, workers: int | None, source: str) -> None:
    """Check one result's identity, completeness and the consistency of its aggregates.

    Raises:
        ValueError: naming the file and what is wrong.
    """
    if result.get("schema") != 1:
        raise ValueError(f"{source}: unknown result schema {result.get('schema')!r}")
    if result["state"]["key"] != key or result["case"] != case:
        raise ValueError(f"{source}: holds state {result['state']['key'][:12]} / {result['case']}, "
                         f"expected {key[:12]} / {case}")
    missing = [k for k in STATISTICS if k not in result["statistics"]]
    if missing:
        raise ValueError(f"{source}: statistics {missing} are missing")
    counts = result["counts"]
    recomputed = summarise(result["noise_samples"], result["random_directions"],
                           result["statistics"]["full_grad_norm"], result["statistics"]["grad_curvature"],
                           counts["parameters_D"], counts["effective_batch_size"], counts["epoch_sequences"])
    for name, value in recomputed.items():
        if not _agree(value, result["statistics"][name]):
            raise ValueError(f"{source}: {name} = {result['statistics'][name]!r} disagrees with its per-sample "
                             f"records ({value!r})")
    if workers is not None:
        consensus = result.get("consensus")
        if not consensus or [w["worker"] for w in consensus["workers"]] != list(range(workers)):
            raise ValueError(f"{source}: consensus results for workers 0..{workers - 1} are missing")
        q = math.fsum(w["curvature"] for w in consensus["workers"])
        ee = math.fsum(w["squared_norm"] for w in consensus["workers"])
        aggregate = consensus["aggregate"]
        if not (_agree(aggregate["mean_curvature"], q / workers)
                and _agree(aggregate["normalized_alignment"], None if ee == 0 else q / ee)):
            raise ValueError(f"{source}: consensus aggregates disagree with the worker records")


def _cell(value: Any) -> Any:
    return "" if value is None else value


def collect(analysis_dir: str | Path, states: dict[str, Any], cases: list[str], name: str) -> dict[str, Any]:
    """Validate ``states/<key>/<case>.json`` for every state and case, then write manifest.json and
    summary.csv atomically into ``analysis_dir``. Returns the manifest."""
    analysis_dir = Path(analysis_dir)
    workers = states["workers"] if states["consensus"] else None
    results, identity = {}, None
    for state in states["states"]:
        for case in cases:
            path = analysis_dir / "states" / state["key"] / f"{case}.json"
            if not path.exists():
                raise ValueError(f"result {path} is missing; rerun the workflow to compute it")
            result = json.loads(path.read_text())
            validate_result(result, state["key"], case, workers, str(path))
            if identity is None:
                identity = result["identity"]
            elif result["identity"]["hash"] != identity["hash"]:
                raise ValueError(f"{path} was computed with another identity (settings, source or device kind) "
                                 "than the other results; use one output directory per setting")
            results[state["key"], case] = result

    rows = []
    for state in states["states"]:
        for alias in state["aliases"]:
            for case in cases:
                result = results[state["key"], case]
                aggregate = (result.get("consensus") or {}).get("aggregate") or {}
                rows.append({"file": alias["file"], "state_key": state["key"], "case": case, "step": alias["step"],
                             "tokens": alias["tokens"], **{k: _cell(result["statistics"][k]) for k in STATISTICS},
                             **{c: _cell(aggregate.get(c.removeprefix("consensus_"))) for c in CONSENSUS_COLUMNS}})
    rows.sort(key=lambda r: (r["tokens"], r["file"], cases.index(r["case"])))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SUMMARY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)

    first = next(iter(results.values()))
    manifest = {
        "format": 1, "analysis": name, "run": states["run"], "cases": cases,
        "packed": states["packed"], "workers": states["workers"], "consensus": states["consensus"],
        "identity": identity, "settings": first["settings"], "precision": first["precision"],
        "software": first["software"],
        "hardware": list({json.dumps(r["hardware"], sort_keys=True): r["hardware"] for r in results.values()}.values()),
        "slurm_jobs": [r["slurm"] | {"state": k[:12], "case": c} for (k, c), r in results.items() if r.get("slurm")],
        "data": {case: results[states["states"][0]["key"], case]["data"] for case in cases},
        "batch_sizes": {case: {k: results[states["states"][0]["key"], case]["counts"][k]
                               for k in ("effective_batch_size", "micro_batch_size", "hvp_batch_size",
                                         "directions_per_pass", "epoch_batches", "epoch_tokens", "parameters_D")}
                        for case in cases},
        "states": [{**state, "results": {case: f"states/{state['key']}/{case}.json" for case in cases},
                    "worker_files": results[state["key"], cases[0]]["state"].get("worker_files")}
                   for state in states["states"]],
    }
    atomic_write_text(analysis_dir / "summary.csv", buffer.getvalue())
    atomic_write_json(analysis_dir / "manifest.json", manifest)
    return manifest
