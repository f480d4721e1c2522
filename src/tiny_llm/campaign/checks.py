"""What a workflow configuration must satisfy before any job, and the runs it declares: keys the
schema does not know, schema errors in one line each, devices this machine has, tokenizer
directories, corpora large enough for their runs, profile values typed, seed experiments expanded
into runs, and run configurations loaded with their overrides. Each refusal names the config key.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tiny_llm.config import RunConfig, apply_overrides, config_from_dict, config_to_dict, load_config_dict, parse_yaml
from tiny_llm.data.corpus import read_tokenizer
from tiny_llm.data.tokens import capacity_blocks
from tiny_llm.geometry.settings import geometry_settings_from_dict

__all__ = [
    "check_corpus",
    "check_device",
    "check_tokenizer_directory",
    "check_local_ranks",
    "in_folder",
    "local_device",
    "order_keys_without_order",
    "cuda_devices",
    "expand_seed_experiments",
    "expand_seed_imports",
    "load_run_config",
    "schema_errors",
    "typed_profile_values",
    "unknown_keys",
]


def unknown_keys(config: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """One line per mapping of ``config`` that holds keys its part of the JSON ``schema`` does not
    allow (``additionalProperties: false``), naming where, e.g. ``analyses.demo.settings``.

    Example:
        >>> schema = {"properties": {"a": {"additionalProperties": False, "properties": {"b": {}}}}}
        >>> unknown_keys({"a": {"b": 1, "c": 2}}, schema)
        ["a: unknown key 'c' (allowed: b)"]
    """
    if not isinstance(config, dict):
        return []
    properties, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
    lines = []
    for key, value in config.items():
        where = f"{path}.{key}" if path else str(key)
        if key in properties:
            lines += unknown_keys(value, properties[key], where)
        elif isinstance(extra, dict):
            lines += unknown_keys(value, extra, where)
        elif extra is False:
            lines.append(
                f"{path or 'the configuration'}: unknown key {key!r} (allowed: {', '.join(sorted(properties))})"
            )
    return lines


ORDER_KEYS = ("case_steps", "batch_sequences")
"""An analysis's keys that cut a training order's windows: meaningless without one."""


def order_keys_without_order(config: dict[str, Any]) -> list[str]:
    """One line per analysis that sets a training order's window keys without a ``training_order``
    (read before the schema fills in their defaults, which would hide them).

    Example:
        >>> order_keys_without_order({"analyses": {"a": {"run": "runs/a", "case_steps": 4}}})
        ["analyses.a.case_steps: applies to an analysis with a training_order (the windows of a suite's published order); remove it, or give the training_order"]
    """  # noqa: E501
    lines = []
    for name, entry in (config.get("analyses") or {}).items():
        if isinstance(entry, dict) and "training_order" not in entry:
            lines += [
                f"analyses.{name}.{key}: applies to an analysis with a training_order (the windows of a suite's "
                "published order); remove it, or give the training_order"
                for key in ORDER_KEYS
                if key in entry
            ]
    return lines


def schema_errors(config: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """The configuration's violations of the JSON ``schema``, one line each, naming the key.

    Example:
        >>> schema = {"properties": {"a": {"properties": {"n": {"type": "integer", "minimum": 1}}}}}
        >>> schema_errors({"a": {"n": -3}}, schema)
        ['a.n: -3 is less than the minimum of 1']
    """
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{'.'.join(map(str, error.absolute_path)) or 'the configuration'}: {error.message}" for error in errors]


def in_folder(path: Path, parent: str, key: str, need: str, then: str = "") -> Path:
    """``path``, a folder ``<parent>/<name>``; else refused naming ``key``, what the workflow
    ``need``s of it, and ``then`` (what to do) after the path given."""
    if path.parent != Path(parent):
        raise ValueError(f"{key}: {need}, got {path}{then}")
    return path


def local_device(device: str) -> str:
    """The device a job run here computes on: ``auto`` resolved (cuda where this machine has one)."""
    return device if device != "auto" else "cuda" if cuda_devices() > 0 else "cpu"


def check_device(key: str, device: str) -> None:
    """Refuse a CUDA device this machine does not have, for jobs that run on it.

    Raises:
        ValueError: naming the config ``key`` and what to set instead.
    """
    if not device.startswith("cuda"):
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        have = f"only {count} CUDA device{'s' if count != 1 else ''}" if count else "no CUDA device"
        raise ValueError(
            f"{key}: {device}, but this machine has {have} and the jobs run here; set {key} to cpu "
            "or auto, or run on the cluster (--profile profiles/naiss)"
        )


def _source_tokens(path: Path) -> int:
    """Tokens an input file holds: bytes for text, elements for .npy, uint16 elements for .bin."""
    if path.suffix == ".npy":
        import numpy as np

        return int(np.load(path, mmap_mode="r", allow_pickle=False).shape[0])
    return path.stat().st_size // (2 if path.suffix == ".bin" else 1)


def cuda_devices() -> int:
    """CUDA devices this process sees (torch is imported only when asked)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_tokenizer_directory(key: str, directory: str, vocab_size: int | None = None) -> None:
    """A configured tokenizer directory must exist here and hold a readable tokenizer.json, whose
    vocabulary fits the model's ``vocab_size`` (when given).

    Raises:
        ValueError: naming ``key``.
    """
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(
            f"{key}: {directory} is not a local directory (paths are relative to the project "
            "directory); give a directory holding the tokenizer's tokenizer.json"
        )
    if not (path / "tokenizer.json").is_file():
        raise ValueError(
            f"{key}: {directory} has no tokenizer.json; save a fast tokenizer there "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(DIR))"
        )
    if vocab_size is None:
        return
    try:
        tokens = read_tokenizer(path)[1]["vocab_size"]
    except ValueError as error:
        raise ValueError(f"{key}: {error}") from None
    if tokens > vocab_size:
        raise ValueError(
            f"{key}: {directory}'s vocabulary ({tokens} tokens) exceeds the model's vocab_size {vocab_size}, so "
            "its ids would not be the model's; give the model's own tokenizer"
        )


def check_corpus(name: str, entry: dict[str, Any], run: RunConfig, need: str, key: str = "train_runs") -> None:
    """Refuse, before the cache is built, input files that are missing or hold too little for
    training (``need="train"``) or training plus one unseen epoch (``"unseen"``).

    Raises:
        ValueError: naming the config keys, the tokens there are and needed, and both ways out.
    """
    if entry.get("cache_tokenizer") is not None:
        check_tokenizer_directory(f"{key}.{name}.cache_tokenizer", entry["cache_tokenizer"], run.model.vocab_size)
    if entry.get("cache_source", "demo") == "demo":
        return
    counted = entry.get("cache_tokenizer") is None  # bytes are tokens; a tokenizer's count is known only after encoding
    T, G = run.data.seq_len, run.data.shuffle_group_blocks
    total = 0
    for file in entry.get("cache_inputs", []):
        path = Path(file)
        if not path.is_file():
            raise ValueError(
                f"{key}.{name}.cache_inputs: {file} does not exist (paths are relative to the project directory)"
            )
        total += max(_source_tokens(path) - 1, 0) // T
    available = total // G * G
    needed = capacity_blocks(run)[need]
    if available >= needed or not counted:
        return
    unit = "bytes" if entry.get("cache_source") == "text" else "tokens"
    what = "training and one unseen epoch" if need == "unseen" else "training"
    fits = None
    for steps in range(run.steps_per_epoch - 1, 0, -1):  # the largest whole-epoch budget that fits
        tokens = steps * run.training.epochs * run.batch_tokens
        smaller = config_from_dict(apply_overrides(config_to_dict(run), [f"training.tokens={tokens}"]))
        if capacity_blocks(smaller)[need] <= available:
            fits = tokens
            break
    lower = (
        f"lower training.tokens to at most {fits:,} ({key}.{name}.set: {{training.tokens: {fits}}})"
        if fits
        else "use a smaller model batch or context"
    )
    raise ValueError(
        f"{key}.{name}.cache_inputs: the corpus holds about {available * T:,} {unit} in whole "
        f"sequences, but {what} at training.tokens={run.training.tokens:,} need about "
        f"{needed * T:,}; add text to {key}.{name}.cache_inputs, or {lower}"
    )


def typed_profile_values(config: dict[str, Any], keys: Iterable[str] = ("settings_override", "cluster")) -> None:
    """Read a profile's ``config:`` values, which arrive as strings ('True', '64'), as YAML scalars,
    in place, so that schema validation sees numbers and booleans (``cluster.walltime_hours: '12'``)."""

    def typed(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: typed(item) for key, item in value.items()}
        return parse_yaml(value) if isinstance(value, str) else value

    for key in keys:
        if isinstance(config.get(key), dict):
            config[key] = typed(config[key])


def _overrides(settings: dict[str, Any]) -> list[str]:
    return [f"{key}={value}" for key, value in settings.items()]


def expand_seed_experiments(
    experiments: dict[str, Any], train_runs: dict[str, Any], analyses: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """The training runs of every seed experiment, beside ``train_runs``.

    Each experiment trains ``<experiment>-seed-<s>`` per seed, and the controls
    ``<experiment>-same-seed`` (the first seed again) and ``<experiment>-data-order`` (the first
    seed, ``data.seed + 1``). Every run writes interval checkpoints; they share one token cache.

    Returns:
        (every train_runs entry, experiment -> {run name: role}).

    Raises:
        ValueError: a name clash with an analysis or a train_runs entry, or bad settings, naming the key.
    """
    runs, roles = dict(train_runs), {}
    for name, entry in experiments.items():
        if "hf_checkpoints" in entry:  # trained elsewhere: expand_seed_imports
            continue
        if "seeds" not in entry:
            raise ValueError(
                f"seed_experiments.{name}: give seeds (runs trained here) or hf_checkpoints (one checkpoint "
                "list per seed, trained elsewhere)"
            )
        if name in analyses:
            raise ValueError(
                f"seed_experiments.{name}: an analysis has the same name (both write results/{name}/); rename one"
            )
        base = {
            key: entry[key]
            for key in ("config", "cache_source", "cache_inputs", "shard_tokens", "cache_order", "cache_tokenizer")
            if key in entry
        }
        fixed = {**entry.get("set", {}), "training.checkpoint_policy": "interval"}
        data = config_from_dict(apply_overrides(load_config_dict(entry["config"]), _overrides(fixed))).data
        data_seed = data.seed
        need = "data.cache must be cache/<name> for the workflow to prepare the seeds' cache"
        then = f" (from {entry['config']}); name one, or set data.cache in set"
        in_folder(Path(data.cache), "cache", f"seed_experiments.{name}.config", need, then)
        first = entry["seeds"][0]
        members = {f"{name}-seed-{seed}": ("seed", {"training.seed": seed}) for seed in entry["seeds"]}
        controls = entry.get("controls", ["same-seed", "data-order"])
        if "same-seed" in controls:
            members[f"{name}-same-seed"] = ("same-seed", {"training.seed": first})
        if "data-order" in controls:
            members[f"{name}-data-order"] = ("data-order", {"training.seed": first, "data.seed": data_seed + 1})
        for run, (_, overrides) in members.items():
            if run in runs:
                raise ValueError(f"seed_experiments.{name} trains runs/{run}, which train_runs also names; rename one")
            runs[run] = {**base, "set": {**fixed, **overrides}}
        roles[name] = {run: role for run, (role, _) in members.items()}
        try:
            geometry_settings_from_dict(entry.get("settings"))
        except (TypeError, ValueError) as error:
            raise ValueError(f"seed_experiments.{name}.settings: {error}") from None
    return runs, roles


SEED_IMPORT_KEYS = ("config", "set", "tokens_per_step", "allow_identical_states")
"""Keys of a seed experiment of hf_checkpoints that every seed's import takes."""
CACHE_KEYS = ("cache_source", "cache_inputs", "cache_tokenizer", "cache_order", "shard_tokens")
"""Keys that prepare the experiment's one cache (taken by the first seed's import, which prepares it)."""


def expand_seed_imports(
    experiments: dict[str, Any], taken: dict[str, Any], analyses: dict[str, Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    """The imports of every seed experiment of models trained elsewhere (``hf_checkpoints``: seed ->
    its checkpoint list, as PolyPythia publishes them): ``<experiment>-seed-<seed>`` per seed,
    imported into runs/ as an analysis's hf_checkpoints are, sharing the experiment's one cache
    (prepared by the first seed's import). Controls are trained here and do not apply.

    Returns:
        (run name -> its import entry, experiment -> {run name: "seed"}).

    Raises:
        ValueError: seeds and hf_checkpoints together, controls, fewer than two seeds, a name clash
            or bad settings, naming the key.
    """
    imports, roles = {}, {}
    for name, entry in experiments.items():
        if "hf_checkpoints" not in entry:
            continue
        key = f"seed_experiments.{name}"
        if "seeds" in entry:
            raise ValueError(f"{key}: seeds (trained here) and hf_checkpoints (trained elsewhere) exclude each other")
        if entry.get("controls") not in (None, [], ["same-seed", "data-order"]):  # the default: none apply
            raise ValueError(f"{key}.controls: controls are trained here; an experiment of hf_checkpoints has none")
        if name in analyses:
            raise ValueError(f"{key}: an analysis has the same name (both write results/{name}/); rename one")
        lists = entry["hf_checkpoints"]
        if not isinstance(lists, dict) or len(lists) < 2:
            raise ValueError(f"{key}.hf_checkpoints: expected two or more seeds, each with its checkpoint list")
        members = {}
        for position, (seed, checkpoints) in enumerate(lists.items()):
            run = f"{name}-seed-{seed}"
            if run in taken or run in imports:
                raise ValueError(f"{key} imports runs/{run}, which another entry names too; rename one")
            shared = SEED_IMPORT_KEYS + (CACHE_KEYS if position == 0 else ())
            source = {"cache_source": "text"} if entry.get("cache_source", "demo") == "demo" else {}
            imports[run] = {
                **{k: entry[k] for k in shared if k in entry},
                **(source if position == 0 else {}),  # cache_inputs are text unless cache_source: tokens
                "hf_checkpoints": checkpoints,
                "run": f"runs/{run}",
                "owner": key,
                "seed": seed,
            }
            members[run] = "seed"
        roles[name] = members
        try:
            geometry_settings_from_dict(entry.get("settings"))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{key}.settings: {error}") from None
    return imports, roles


def load_run_config(entry: dict[str, Any], training: dict[str, Any] | None = None) -> RunConfig:
    """A run the workflow trains is meant for analysis: unless its configuration says otherwise,
    it writes interval checkpoints (one state per virtual epoch, not just the final one).
    ``training``: further defaults of keys its ``training`` section does not give."""
    data = load_config_dict(entry["config"])
    overrides = _overrides(entry.get("set", {}))
    given = data.get("training") or {}
    defaults = {"checkpoint_policy": "interval", **(training or {})}
    overrides[:0] = [f"training.{key}={value}" for key, value in defaults.items() if key not in given]
    return config_from_dict(apply_overrides(data, overrides))


def check_local_ranks(key: str, ranks: dict[str, int], device: str) -> None:
    """The ranks of an analysis's jobs (``key``: the analysis's config key) that run on this machine:
    several nodes need a Slurm allocation, and N CPU processes need N usable cores (N GPUs: N CUDA
    devices).

    Raises:
        ValueError: naming the key and what to set instead.
    """
    if ranks["nodes"] > 1 and not os.environ.get("SLURM_JOB_NODELIST"):
        raise ValueError(
            f"{key}.nodes_per_job: {ranks['nodes']} nodes need a Slurm allocation "
            "(run with --profile profiles/naiss, or inside salloc); set 1 to run here"
        )
    if ranks["gpus"] <= 1:
        return
    cuda = local_device(device).startswith("cuda")
    if cuda:
        usable = cuda_devices()
    else:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if ranks["gpus"] > usable:
        what = "CUDA devices" if cuda else "usable CPU cores"
        raise ValueError(
            f"{key}.gpus_per_job: {ranks['gpus']} ranks per job, but this machine has {usable} {what}; set at "
            f"most {usable} to run here (on the cluster each rank is a GPU)"
        )
