"""The comparison of seeds: per step, every pair of runs' records (gradient, logits, subspaces) compared
as cosines and overlaps, with the controls' pairs as baselines, summarised per seed pair and written
as comparison.csv (what the dashboard and ``tiny-llm compare`` draw).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from tiny_llm.geometry import metrics as geometry

__all__ = ["compare", "write_comparison"]

log = logging.getLogger(__name__)


def _load(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    record = json.loads(path.read_text())
    tensors = path.with_name(record["vectors"]["file"])
    if hashlib.sha256(tensors.read_bytes()).hexdigest() != record["vectors"]["sha256"]:
        raise ValueError(f"{tensors} does not match {path} (changed after it was written); delete both and rerun")
    return record, load_file(str(tensors))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    na, nb = float(a.norm()), float(b.norm())
    return float(a @ b) / (na * nb) if na > 0 and nb > 0 else None


def _warn_unconverged(loaded: dict[str, list]) -> None:
    """A warning naming the checkpoints whose top Hessian eigenvalue did not converge."""
    unconverged = [
        f"{label} step {r['step']}"
        for label, items in loaded.items()
        for r, _ in items
        if (r.get("lanczos") or {}).get("converged") is False
    ]
    if unconverged:
        log.warning(
            "the top Hessian eigenvalue did not converge at %d checkpoints (%s); raise settings.lanczos_steps",
            len(unconverged),
            ", ".join(unconverged[:4]) + (" ..." if len(unconverged) > 4 else ""),
        )


def _pair_roles(role: dict[str, str], controls: dict[str, str], records: dict) -> Callable[[str, str], str]:
    """A pair's role: ``seed`` for two seeds, a control's role for the control and the first seed,
    ``other`` for any other pair with a control."""
    first = next((label for label in list(controls) + sorted(records) if role.get(label) == "seed"), None)

    def pair_role(a: str, b: str) -> str:
        if role[a] == role[b] == "seed":
            return "seed"
        control = {a: b, b: a}
        for one in (a, b):
            if role[one] != "seed" and control[one] == first:
                return role[one]
        return "other"

    return pair_role


def _pair_metrics(dims: dict, ta: dict, ua, tb: dict, ub) -> dict[str, tuple[float | None, float]]:
    """Metric -> (value, the value two random directions or subspaces would give) for one pair."""
    return {
        "gradient_cosine": (_cosine(ta["reference_gradient"], tb["reference_gradient"]), 0.0),
        "parameter_subspace_overlap": (
            geometry.subspace_overlap(ta["parameter_basis"], tb["parameter_basis"]),
            geometry.random_overlap(dims["parameters_D"], dims["k"]),
        ),
        "function_subspace_overlap": (
            geometry.subspace_overlap(ta["function_basis"], tb["function_basis"]),
            geometry.random_overlap(dims["function_F"], dims["k"]),
        ),
        "function_update_cosine": ((_cosine(ua, ub) if ua is not None and ub is not None else None), 0.0),
    }


def _row(
    step: int, tokens: int | None, subject: str, kind: str, role: str, metric: str, measured: tuple
) -> dict[str, Any]:
    """One row of comparison.csv; ``measured`` is (value, its standard error, its baseline)."""
    value, se, baseline = measured
    return {
        "step": step,
        "tokens": tokens,
        "subject": subject,
        "kind": kind,
        "role": role,
        "metric": metric,
        "value": value,
        "se": se,
        "baseline": baseline,
    }


def compare(records: dict[str, list[Path]], controls: dict[str, str]) -> list[dict[str, Any]]:
    """Rows of comparison.csv from each run's checkpoint records (run label -> JSON paths).

    ``controls`` maps a run label to its role: ``seed`` (an ordinary seed, the default),
    ``same-seed`` (the first seed trained again) or ``data-order`` (the first seed with another data
    order); the first seed is the first label whose role is ``seed``. A pair's role is ``seed`` for
    two seeds, the control's role for a control and the first seed (what the control varies), and
    ``other`` for any other pair with a control.
    """
    loaded = {
        label: sorted((_load(Path(p)) for p in paths), key=lambda item: item[0]["step"])
        for label, paths in records.items()
    }
    _warn_unconverged(loaded)
    references = {r["reference"] for items in loaded.values() for r, _ in items}
    if len(references) > 1:
        raise ValueError("the records were measured on different reference sets; delete them and rerun")
    role = {label: controls.get(label, "seed") for label in records}
    pair_role = _pair_roles(role, controls, records)

    rows: list[dict[str, Any]] = []
    by_step: dict[int, dict[str, tuple[dict, dict, torch.Tensor | None]]] = {}
    for label, items in loaded.items():
        previous = None
        for record, tensors in items:
            update = None if previous is None else tensors["reference_logits"] - previous
            previous = tensors["reference_logits"]
            by_step.setdefault(record["step"], {})[label] = (record, tensors, update)
            for metric, value in record["metrics"].items():
                se = record["standard_errors"].get(metric)
                rows.append(
                    _row(record["step"], record.get("tokens"), label, "run", role[label], metric, (value, se, None))
                )
    for step, runs in sorted(by_step.items()):
        for a, b in itertools.combinations(sorted(runs), 2):
            (ra, ta, ua), (_, tb, ub) = runs[a], runs[b]
            for metric, (value, baseline) in _pair_metrics(ra["dimensions"], ta, ua, tb, ub).items():
                subject = f"{a}|{b}"
                rows.append(
                    _row(step, ra.get("tokens"), subject, "pair", pair_role(a, b), metric, (value, None, baseline))
                )
    rows += _seed_pair_summary(rows)
    return [
        {**row, "value": None if row["value"] is None or not math.isfinite(row["value"]) else row["value"]}
        for row in rows
    ]


def _seed_pair_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step and pair metric, the mean and the minimum over the seed pairs (kind ``summary``)."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["kind"] == "pair" and row["role"] == "seed" and row["value"] is not None:
            groups.setdefault((row["step"], row["metric"]), []).append(row)
    summary = []
    for (step, metric), members in sorted(groups.items()):
        values = [row["value"] for row in members]
        for name, value in (("mean", sum(values) / len(values)), ("min", min(values))):
            summary.append(
                {
                    "step": step,
                    "tokens": members[0].get("tokens"),
                    "subject": f"seed pairs ({name})",
                    "kind": "summary",
                    "role": "seed",
                    "metric": metric,
                    "value": value,
                    "se": None,
                    "baseline": members[0]["baseline"],
                }
            )
    return summary


def write_comparison(rows: list[dict[str, Any]], path: str | Path) -> None:
    """comparison.csv (columns step, tokens, subject, kind, role, metric, value, se, baseline), atomically."""
    import pandas as pd

    path = Path(path)
    frame = pd.DataFrame(
        rows, columns=["step", "tokens", "subject", "kind", "role", "metric", "value", "se", "baseline"]
    )
    staging = path.with_name(f".{path.name}.tmp")
    frame.to_csv(staging, index=False)
    staging.replace(path)
