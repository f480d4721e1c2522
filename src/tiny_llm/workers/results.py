"""A result's identity: what it depends on (source, numerical settings, execution, run) decides
whether a finished result is reused or refused (its one writer is
:func:`tiny_llm.distributed.single_writer`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tiny_llm.config import RunConfig, config_to_dict
from tiny_llm.data.tokens import TokenCache
from tiny_llm.provenance import canonical_hash, source_hash
from tiny_llm.workers.loading import Resolved
from tiny_llm.workers.settings import AnalysisSettings, numerical_settings

__all__ = ["check_same_batches", "check_successor", "result_identity", "reusable_result"]


def result_identity(settings: AnalysisSettings, resolved: Resolved, config: RunConfig, cache: Any) -> dict:
    """What a (state, case) result's numbers depend on, and its hash: the numerical settings as the
    job resolved them (device kind, engine), the run's configuration and the data: the cache's
    content, or a training order's files (one identity for the whole analysis, as for a cache: the
    case's window is the result's ``data.plan``, which a reuse must match)."""
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
        **(
            {"cache_shards": [s["sha256"] for s in cache.meta["shards"]]}
            if isinstance(cache, TokenCache)
            else {"training_order": cache.describe()}  # the window: the result's data.plan, checked on reuse
        ),
    }
    identity = {"source": source_hash(), "settings": numerical, "execution": execution, "run": canonical_hash(run)}
    return {**identity, "hash": canonical_hash(identity)}


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


def check_successor(old: dict[str, Any], successor: dict[str, Any] | None, output: Path) -> None:
    """A reusable result was measured along the step to the same successor (the trajectory
    statistics and the step's alignment depend on it).

    Raises:
        ValueError: naming the file and both successors.
    """
    measured = (old.get("trajectory") or {}).get("successor")
    if measured != successor:
        raise ValueError(
            f"{output} was measured along the step to {measured}, not to {successor} (the analysed "
            "checkpoints changed); use a new output directory"
        )


def check_same_batches(measured: str | None, plan: str, output: Path) -> None:
    """A reusable result was measured on the case's batches as they are planned now (its window
    and noise batch: the analysed checkpoints, ``case_steps`` and ``batch_sequences`` decide them).

    Raises:
        ValueError: naming the file and both.
    """
    if measured != plan:
        raise ValueError(
            f"{output} holds the case's batches {measured}, not {plan} (the analysed checkpoints, case_steps or "
            "batch_sequences changed); use a new output directory"
        )
