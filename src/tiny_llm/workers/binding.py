"""What an output directory is bound to (run, settings, source): results made with other
settings are refused before any job runs. Torch-free, for the planner; a single result's identity
and its one writer are :mod:`tiny_llm.workers.results`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tiny_llm.io import atomic_write_json
from tiny_llm.layout import SUMMARY
from tiny_llm.provenance import source_hash
from tiny_llm.workers.settings import AnalysisSettings, numerical_settings

log = logging.getLogger(__name__)


def output_binding(settings: AnalysisSettings, run: str, spectrum: dict[str, Any] | None = None) -> dict[str, Any]:
    """What an output directory is bound to: the run, the settings (spectral ones too) and the
    tiny_llm source."""
    return {
        "run": str(run),
        "settings": numerical_settings(settings),
        "spectrum": spectrum or {},
        "source": source_hash(),
    }


def holds_results(output_dir: str | Path) -> bool:
    """Whether an output directory holds any finished measurement (state or spectrum results, or a
    collected summary)."""
    root = Path(output_dir)
    return (root / SUMMARY).exists() or any(root.glob("states/*/*.json")) or any(root.glob("spectra/*/*.json"))


def check_output_binding(output_dir: str | Path, binding: dict[str, Any]) -> list[str]:
    """Refuse an output directory whose results were made with another run, other settings or other
    source code. A binding with no result yet (a first attempt that failed) does not hold: what
    changed is returned, and :func:`bind_output` replaces it. Writes nothing.

    Returns:
        What changed against a binding that holds no result (empty when there is none or nothing).

    Raises:
        ValueError: naming what changed and what to do (a new name, the old settings, or removing
            the results).
    """
    path = Path(output_dir) / "identity.json"
    if not path.exists():
        return []
    try:
        old = json.loads(path.read_text())
        old["run"], old["settings"], old["source"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(
            f"{path} is damaged (not the binding of an output directory); restore it, or remove "
            f"{output_dir} (its results) or use a new analysis name"
        ) from None
    changed = _changes(old, binding)
    if changed and holds_results(output_dir):
        fix = (
            f"use a new output directory (a new analysis name), restore the settings, or remove {output_dir} "
            "(its results) to recompute it with these settings"
        )
        if changed == ["the tiny_llm source code changed"]:
            fix = (
                f"use a new analysis name, or remove {output_dir} to recompute it with this code "
                "(or go back to the code that made it)"
            )
        raise ValueError(f"{output_dir} holds results made with other settings ({'; '.join(changed)}); {fix}")
    return changed


def _changes(old: dict[str, Any], binding: dict[str, Any]) -> list[str]:
    """What differs between a recorded binding and this one, in words."""
    changed = [f"run: {old['run']} -> {binding['run']}"] if old["run"] != binding["run"] else []

    def shown(key: str, value: Any) -> str:
        return "all" if key == "noise_samples" and value is None else repr(value)

    changed += [
        f"settings.{k}: {shown(k, old['settings'].get(k))} -> {shown(k, v)}"
        for k, v in binding["settings"].items()
        if old["settings"].get(k) != v
    ]
    changed += [
        f"spectrum.{k}: {old.get('spectrum', {}).get(k)!r} -> {v!r}"
        for k, v in binding["spectrum"].items()
        if old.get("spectrum", {}).get(k) != v
    ]
    for key in sorted((set(old) | set(binding)) - {"run", "settings", "spectrum", "source"}):
        changed += _nested_changes(key, old.get(key), binding.get(key))
    if old["source"] != binding["source"]:
        changed.append("the tiny_llm source code changed")
    return changed


def _nested_changes(key: str, old: Any, new: Any) -> list[str]:
    """Each differing leaf of two bound values (e.g. an analysis's training order), by its dotted
    key as the configuration spells it."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(set(old) | set(new)) for c in _nested_changes(f"{key}.{k}", old.get(k), new.get(k))]
    return [] if old == new else [f"{key}: {old!r} -> {new!r}"]


def bind_output(output_dir: str | Path, binding: dict[str, Any]) -> None:
    """Record the binding of an output directory (identity.json), after the same check: when it
    has none yet, or replace one that binds no result (saying what changed).

    Raises:
        ValueError: as :func:`check_output_binding`.
    """
    changed = check_output_binding(output_dir, binding)
    path = Path(output_dir) / "identity.json"
    if path.exists() and not changed:
        return
    atomic_write_json(path, binding)
    if changed:
        log.info(
            "%s held no result yet: its binding now follows the changed settings (%s)", output_dir, "; ".join(changed)
        )
