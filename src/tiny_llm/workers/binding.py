"""What a result and an output directory are bound to, and the one writer of each result.

A result's identity (source, numerical settings, execution, run) decides whether a finished result
is reused or refused; an output directory's binding (run, settings, source) refuses results made
with other settings; ``single_writer`` lets rank 0 alone write, under a lock, after every rank
computed.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tiny_llm.config import RunConfig, config_to_dict
from tiny_llm.data.tokens import TokenCache
from tiny_llm.distributed import barrier, broadcast, is_writer
from tiny_llm.io import atomic_write_json, exclusive, remove_leftovers
from tiny_llm.layout import SUMMARY
from tiny_llm.provenance import canonical_hash, source_hash
from tiny_llm.workers.loading import Resolved
from tiny_llm.workers.settings import AnalysisSettings, numerical_settings

log = logging.getLogger(__name__)


def result_identity(settings: AnalysisSettings, resolved: Resolved, config: RunConfig, cache: TokenCache) -> dict:
    """What a (state, case) result's numbers depend on, and its hash: the numerical settings as the
    job resolved them (device kind, engine), the run's configuration and the cache's content."""
    numerical = {
        **numerical_settings(settings),
        "device": resolved.device.type,
        "engine": resolved.engine,
        "compiled": resolved.compiled,
        "hvp_engine": resolved.hvp_engine,
        "hvp_compiled": resolved.hvp_compiled,
        "tf32": resolved.tf32,
        "hvp_batch_size": resolved.hvp_batch_size,
        "micro_batch_size": config.training.micro_batch_size,
    }
    execution = {
        "device_kind": resolved.device.type
        if resolved.device.type == "cpu"
        else f"cuda:{torch.cuda.get_device_name(resolved.device)}"
    }
    run = {
        "config": config_to_dict(config) | {"data": {**config_to_dict(config)["data"], "cache": None}},
        "cache_shards": [s["sha256"] for s in cache.meta["shards"]],
    }
    identity = {"source": source_hash(), "settings": numerical, "execution": execution, "run": canonical_hash(run)}
    return {**identity, "hash": canonical_hash(identity)}


def _exclusive(output: Path) -> contextlib.AbstractContextManager:
    return exclusive(output.with_name(f".{output.name}.lock"), f"writing {output}")


def reusable_result(output: Path, identity: dict, key: str, case: str) -> dict | None:
    """The result already at ``output`` when it was made for this identity, state and case (reused,
    not recomputed); None otherwise."""
    if not output.exists():
        return None
    try:
        old = json.loads(output.read_text())
        same = old["identity"]["hash"] == identity["hash"] and old["state"]["key"] == key and old["case"] == case
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(
            f"{output} exists but is not a tiny-llm result; remove it or use a new output directory"
        ) from None
    if not same:
        raise ValueError(f"{output} holds a result with other settings, source or state; use a new output directory")
    return old


@contextlib.contextmanager
def single_writer(output: Path) -> Iterator[Callable[[Callable[[], Any]], Any]]:
    """The write of ``output`` by one rank: rank 0 holds its lock (and clears a killed write's
    temporary files) while every rank computes; the decision to reuse a finished result is rank
    0's, shared with all (they must all compute, or none). Every rank leaves together, after the
    write. Yields ``reuse(check)``: the value of ``check()`` on rank 0, on every rank."""
    lock = _exclusive(output) if is_writer() else contextlib.nullcontext()
    failed = False
    with lock:
        if is_writer():
            remove_leftovers(output.parent, output.name)
        try:
            yield lambda check: broadcast(check() if is_writer() else None)
        except BaseException:
            failed = True
            raise
        finally:
            if not failed:
                barrier()


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
    if old["source"] != binding["source"]:
        changed.append("the tiny_llm source code changed")
    return changed


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
