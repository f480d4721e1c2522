"""Timing entries: per-micro-batch seconds measured on the node that will run an analysis.

A timing profile entry is keyed by everything that changes the cost of one micro-batch
(architecture, context length, batch and micro-batch, HVP batch, directions per pass, precision,
engine and device kind) and holds measured seconds: one gradient micro-batch (forward +
backward), one pass of K directions over one curvature micro-batch, and a fixed start-up (model
load, compilation). :mod:`tiny_llm.campaign.plan` scales them to a job's work and turns that into
a walltime. Entries come only from calibrations on the target node
(:mod:`tiny_llm.campaign.calibration`, the job that measures them); this module, which the planner
reads them with, computes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tiny_llm.config import RunConfig
from tiny_llm.io import atomic_write_json, read_if_changed
from tiny_llm.workers.settings import AnalysisSettings, quadratic_form_engine

__all__ = ["load_profiles", "lookup", "lookup_entry", "timing_key", "write_profile"]


def timing_key(config: RunConfig, settings: AnalysisSettings, device_kind: str) -> dict[str, Any]:
    """The setup a timing entry is valid for."""
    m = config.model
    return {
        "d_model": m.d_model,
        "n_layers": m.n_layers,
        "n_heads": m.n_heads,
        "d_ff": m.d_ff,
        "vocab_size": m.vocab_size,
        "seq_len": config.data.seq_len,
        "batch_size": config.training.batch_size,
        "micro_batch_size": config.training.micro_batch_size,
        "hvp_batch_size": settings.hvp_batch_size or config.training.micro_batch_size,
        "directions_per_pass": settings.directions_per_pass,
        "dtype": settings.dtype,
        "amp": settings.amp,
        "tf32": settings.tf32,
        "engine": quadratic_form_engine(settings, m),
        "compile_hvp": settings.compile_hvp,
        "device_kind": device_kind,
    }


def load_profiles(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Timing entries from YAML/JSON files (missing files are skipped)."""
    entries = []
    for path in map(Path, paths):
        if path.is_dir():
            entries += load_profiles(sorted(path.glob("*.json")))
        elif path.exists():
            data = read_if_changed(path, yaml.safe_load) or {}  # asked once per job while planning
            entries += data.get("entries", []) if isinstance(data, dict) else []
    return entries


def lookup_entry(
    entries: list[dict[str, Any]], key: dict[str, Any], gpu_kind: str | None = None
) -> dict[str, Any] | None:
    """The last entry measured for this setup (device kind containing ``gpu_kind`` when given:
    the login node that plans jobs cannot see the compute nodes' GPU)."""

    def same(entry: dict[str, Any]) -> bool:
        other = entry["key"]
        fields_match = all(other.get(k) == v for k, v in key.items() if k != "device_kind")
        return fields_match and (gpu_kind is None or gpu_kind in str(other.get("device_kind")))

    matches = [e for e in entries if same(e)]
    return matches[-1] if matches else None


def lookup(entries: list[dict[str, Any]], key: dict[str, Any], gpu_kind: str | None = None) -> dict[str, float] | None:
    """The seconds of :func:`lookup_entry`'s entry, or None."""
    entry = lookup_entry(entries, key, gpu_kind)
    return entry["seconds"] if entry else None


def write_profile(path: str | Path, entry: dict[str, Any]) -> None:
    """Write one calibration entry as a timing profile file (JSON)."""
    atomic_write_json(path, {"entries": [entry]})
