"""What the workflow computes from its configuration, as plain data: the decisions behind every rule.

:class:`WorkflowPlan` is built once from the workflow's config dict (after schema validation) and
answers the questions the Snakemake rules ask: which runs are trained (``train_runs`` plus the runs
each seed experiment expands to), which cache each run reads, each analysis's settings, the
targets of ``rule all``, the walltime of each job and whether it waits for a calibration, the cost
line printed before a run, and the campaign record's start events. ``workflow/rules/common.smk``
keeps only schema validation and thin input functions that call it.

Re-attaching to an earlier controller's Slurm jobs is decided by :func:`awaited_outputs` and
:func:`sort_earlier_jobs` from the jobs :func:`tiny_llm.campaign.slurm_jobs.earlier_jobs` lists.

Example:
    >>> plan = WorkflowPlan({})
    >>> plan.all_targets()
    []
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tiny_llm.campaign import plan as cost
from tiny_llm.campaign import timing
from tiny_llm.campaign.slurm_jobs import EarlierJob
from tiny_llm.config import (
    RunConfig,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    load_config_dict,
    parse_yaml,
)
from tiny_llm.curvature.memory import GiB, MemoryPlan
from tiny_llm.data.corpus import default_capacity, describe_tokenizer, same_tokenizer
from tiny_llm.data.tokens import TokenCache, capacity_blocks, offset_plan
from tiny_llm.geometry.experiment import (
    as_analysis_settings,
    geometry_settings_from_dict,
    measurement_seconds,
    measurement_work,
)
from tiny_llm.layout import FINAL, IMPORTED, RESOLVED, STATE_DONE, STATE_RESULT, epoch_file, epoch_stem, state_result
from tiny_llm.model.hf import imported_config
from tiny_llm.model.hf_runs import checkpoint_positions, checkpoint_tokenizer
from tiny_llm.results.figures import AUDIT_FIGURES, FIGURES, SPECTRUM_FIGURES
from tiny_llm.workers.binding import check_output_binding, output_binding
from tiny_llm.workers.index import check_selection
from tiny_llm.workers.settings import (
    AnalysisSettings,
    settings_from_dict,
    settings_record,
    sharded_engine,
    spectrum_settings_from_dict,
)
from tiny_llm.workers.state import memory_plan

__all__ = [
    "AWAITABLE",
    "STANDS_IN",
    "WorkflowPlan",
    "awaited_outputs",
    "check_corpus",
    "check_device",
    "expand_seed_experiments",
    "schema_errors",
    "sort_earlier_jobs",
    "typed_profile_values",
    "unknown_keys",
]

AWAITABLE = {
    "analyze_state": STATE_RESULT,
    "finish_state": STATE_DONE,
    "analyze_spectrum": "results/{analysis}/spectra/{key}/{case}.json",
}
"""Outputs of the rules that a local job can stand in for while an earlier controller's job computes them."""

STANDS_IN = {"await_result": "analyze_state", "await_receipt": "finish_state", "await_spectrum": "analyze_spectrum"}
"""The local rule that awaits an earlier job -> the rule it stands in for."""


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


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_tokenizer_directory(key: str, directory: str) -> None:
    """A configured tokenizer directory must exist here and hold a tokenizer.json.

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


def check_corpus(name: str, entry: dict[str, Any], run: RunConfig, need: str, key: str = "train_runs") -> None:
    """Refuse, before the cache is built, input files that are missing or hold too little for
    training (``need="train"``) or training plus one unseen epoch (``"unseen"``).

    Raises:
        ValueError: naming the config keys, the tokens there are and needed, and both ways out.
    """
    if entry.get("cache_tokenizer") is not None:
        check_tokenizer_directory(f"{key}.{name}.cache_tokenizer", entry["cache_tokenizer"])
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
        data_seed = config_from_dict(apply_overrides(load_config_dict(entry["config"]), _overrides(fixed))).data.seed
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


def load_run_config(entry: dict[str, Any]) -> RunConfig:
    """A run the workflow trains is meant for analysis: unless its configuration says otherwise,
    it writes interval checkpoints (one state per virtual epoch, not just the final one)."""
    data = load_config_dict(entry["config"])
    overrides = _overrides(entry.get("set", {}))
    if "checkpoint_policy" not in (data.get("training") or {}):
        overrides.insert(0, "training.checkpoint_policy=interval")
    return config_from_dict(apply_overrides(data, overrides))


def awaited_outputs(jobs: list[EarlierJob], analyses: Iterable[str]) -> dict[str, str]:
    """Output -> id of the running Slurm job of an earlier controller that writes it (only jobs
    whose every target is an awaitable result of a configured analysis)."""
    analyses, awaited = set(analyses), {}
    for job in jobs:
        targets = [(name, dict(wildcards)) for name, wildcards in job.targets]
        if not job.queued and all(
            name in AWAITABLE and wildcards.get("analysis") in analyses for name, wildcards in targets
        ):
            for name, wildcards in targets:
                awaited[AWAITABLE[name].format(**wildcards)] = job.job_id
    return awaited


def sort_earlier_jobs(
    jobs: list[EarlierJob], needed: set[tuple[str, tuple[tuple[str, str], ...]]], awaited: dict[str, str]
) -> tuple[list[str], list[str], list[str]]:
    """The earlier controllers' jobs that compute something this run needs, by what to do:
    (queued jobs to cancel, running jobs awaited by a local job, running jobs to wait for first).

    ``needed`` holds (rule, sorted wildcard items) of every job this run must run, with the await
    rules named as the rules they stand in for. Jobs of other controllers' work are left alone.
    """
    queued, waited, first = [], [], []
    for job in jobs:
        if not any(target in needed for target in job.targets):
            continue
        if job.queued:
            queued.append(job.job_id)
        elif job.job_id in awaited.values():
            waited.append(job.job_id)
        else:
            first.append(job.job_id)
    return queued, waited, first


class WorkflowPlan:
    """The workflow's configuration, resolved: runs, caches, analyses, experiments, walltimes.

    Building it checks everything that can be checked before any job (run configurations, seed
    experiments, analysis settings, checkpoint selections, output directory bindings) and raises
    ``ValueError`` naming the config key.
    """

    def __init__(self, config: dict[str, Any]):
        self.analyses: dict[str, Any] = config.get("analyses") or {}
        self.plots: dict[str, Any] = config.get("plots") or {}
        self.seed_experiments: dict[str, Any] = config.get("seed_experiments") or {}
        self.seed_comparisons: dict[str, Any] = config.get("seed_comparisons") or {}
        self.settings_override: dict[str, Any] = config.get("settings_override") or {}
        """Settings a profile imposes on every analysis (profiles/naiss: CUDA, float32, TF32, compiled HVPs)."""
        self.cluster: dict[str, Any] = config.get("cluster") or {}
        self.train_runs, self.experiment_runs = expand_seed_experiments(
            self.seed_experiments, dict(config.get("train_runs") or {}), self.analyses
        )
        for name, entry in self.seed_comparisons.items():
            unknown = sorted(set(entry["experiments"]) - set(self.seed_experiments))
            if unknown:
                raise ValueError(
                    f"seed_comparisons.{name}: {unknown} are not seed_experiments "
                    f"(known: {sorted(self.seed_experiments)})"
                )
        self.run_configs = {name: load_run_config(entry) for name, entry in self.train_runs.items()}
        self.imports = {
            name: self._check_import(name) for name, entry in self.analyses.items() if "hf_checkpoints" in entry
        }
        """Analyses of Hugging Face checkpoint lists: their run directory (imported by the workflow)
        and the run configuration importing them gives."""
        self.cache_of_run: dict[str, str] = {}
        for name, run in self.run_configs.items():
            cache = Path(run.data.cache)
            if cache.parent != Path("cache"):
                raise ValueError(
                    f"train_runs.{name}: data.cache must be cache/<name> for the workflow to prepare it, got {cache}"
                )
            self.cache_of_run[name] = cache.name
        self.run_of_cache: dict[str, str] = {}
        for name, cache in self.cache_of_run.items():
            self.run_of_cache.setdefault(cache, name)
        self.analysis_caches: dict[str, str] = {}
        """Caches the workflow prepares for hf_checkpoints analyses (``cache_inputs``) -> the analysis."""
        for name, planned in self.imports.items():
            if self.analyses[name].get("cache_inputs"):
                self.analysis_caches[self._analysis_cache(name, planned)] = name
        experiment_of = {run: name for name, runs in self.experiment_runs.items() for run in runs}
        for name, run in self.run_configs.items():
            analysed = any(self.trained_here(a) == name and "unseen" in self.cases(a) for a in self.analyses)
            where = ("seed_experiments", experiment_of[name]) if name in experiment_of else ("train_runs", name)
            check_corpus(where[1], self.train_runs[name], run, "unseen" if analysed else "train", key=where[0])
        self.train_device: str = config.get("train_device", "cpu")
        self.analysis_settings = {name: self._check_analysis(name) for name in self.analyses}
        for name in self.analyses:  # a job that cannot fit its memory budget is refused before any work
            try:
                self.memory(name)
            except ValueError as error:
                raise ValueError(f"analyses.{name}.settings: {error}") from None
        self._pending: dict[str, bool] = {}

    def _check_import(self, name: str) -> RunConfig:
        """An analysis's ``hf_checkpoints``: its run directory (``run``, default runs/<name>) must be
        no trained run's, and the list must import (checked before any work, nothing written).

        Raises:
            ValueError: naming the config key.
        """
        entry = self.analyses[name]
        entry.setdefault("run", f"runs/{name}")
        run = Path(entry["run"])
        if run.parent != Path("runs"):
            raise ValueError(f"analyses.{name}.run: the workflow imports hf_checkpoints into runs/<name>, got {run}")
        if run.name in self.run_configs:
            raise ValueError(
                f"analyses.{name}.run: {run} is trained by train_runs.{run.name}; import the "
                "hf_checkpoints into another run directory"
            )
        if "config" not in entry:
            raise ValueError(
                f"analyses.{name}.config: hf_checkpoints need a run configuration (its data section "
                "names the prepared cache; training.batch_size, micro_batch_size, tokens and epochs "
                "cut the offset epoch)"
            )
        checkpoints = entry["hf_checkpoints"]
        try:
            paths = [Path(c["path"]) for c in checkpoints]
            planned = imported_config(paths, load_run_config({"config": entry["config"], "set": entry.get("set", {})}))
            checkpoint_positions(
                paths,
                [c.get("step") for c in checkpoints],
                [c.get("tokens") for c in checkpoints],
                entry.get("tokens_per_step"),
            )
            carried = checkpoint_tokenizer(paths, planned.model.vocab_size)
        except ValueError as error:
            raise ValueError(f"analyses.{name}.hf_checkpoints: {error}") from None
        self._check_cache_tokenizer(name, planned, carried)
        return planned

    def _analysis_cache(self, name: str, planned: RunConfig) -> str:
        """The cache an hf_checkpoints analysis with ``cache_inputs`` has the workflow prepare: its
        data.cache, cache/<name> of no trained run."""
        cache = Path(planned.data.cache)
        if cache.parent != Path("cache"):
            raise ValueError(
                f"analyses.{name}.config: with cache_inputs the workflow prepares data.cache, which must "
                f"be cache/<name>, got {cache}"
            )
        if cache.name in self.run_of_cache:
            raise ValueError(
                f"analyses.{name}.config: data.cache {cache} is prepared for train_runs."
                f"{self.run_of_cache[cache.name]}; name another cache/<name>"
            )
        if cache.name in self.analysis_caches:
            raise ValueError(
                f"analyses.{name}.config: data.cache {cache} is prepared for analyses."
                f"{self.analysis_caches[cache.name]} too; name another cache/<name>"
            )
        return cache.name

    def _analysis_tokenizer(self, name: str) -> str | None:
        """The tokenizer an hf_checkpoints analysis's cache is encoded with: ``cache_tokenizer``, by
        default the first checkpoint directory's own (when it has a tokenizer.json), else bytes."""
        entry = self.analyses[name]
        if entry.get("cache_tokenizer"):
            check_tokenizer_directory(f"analyses.{name}.cache_tokenizer", entry["cache_tokenizer"])
            return entry["cache_tokenizer"]
        first = Path(entry["hf_checkpoints"][0]["path"])
        return str(first) if (first / "tokenizer.json").exists() else None

    @staticmethod
    def _check_cache_tokenizer(name: str, planned: RunConfig, carried: dict[str, Any] | None) -> None:
        """A prepared cache encoded with another tokenizer than the checkpoints carry is refused at
        start-up (the analysis would refuse it too, after the import)."""
        meta = Path(planned.data.cache) / "meta.json"
        if carried is None or not meta.exists():
            return
        try:
            recorded = json.loads(meta.read_text()).get("tokenizer")
        except (OSError, ValueError, AttributeError):
            return  # the analysis reads the cache and says what is wrong with it
        if not same_tokenizer(carried, recorded):
            remedy = (
                f"prepare a cache with theirs (tiny-llm prepare-data --source text --tokenizer {carried['path']} "
                "...) and name it in data.cache, or list the text in cache_inputs and name a new cache/<name> "
                "for the workflow to prepare"
            )
            raise ValueError(
                f"analyses.{name}.config: the checkpoints carry {describe_tokenizer(carried)}, but "
                f"data.cache {planned.data.cache} was encoded with {describe_tokenizer(recorded)}; "
                f"{remedy}"
            )

    def import_spec(self, run: str) -> dict[str, Any]:
        """What the import of runs/``run`` (an analysis's hf_checkpoints) writes (a change imports again)."""
        entry = self.analyses[self.importing(run)]
        checkpoints = entry["hf_checkpoints"]
        return {
            "directories": [c["path"] for c in checkpoints],
            "steps": [c.get("step") for c in checkpoints],
            "tokens": [c.get("tokens") for c in checkpoints],
            "tokens_per_step": entry.get("tokens_per_step"),
            "config": config_to_dict(load_run_config({"config": entry["config"], "set": entry.get("set", {})})),
        }

    def _expected_states(self, analysis: str, run: RunConfig) -> tuple[int, str]:
        """States an analysis will measure, for its cost line (an import not yet made: its list)."""
        entry = self.analyses[analysis]
        selection = entry.get("checkpoints", "all")
        if analysis in self.imports and selection == "all" and not (Path(entry["run"]) / IMPORTED).exists():
            return len(entry["hf_checkpoints"]), "hf_checkpoints"
        return cost.expected_states(run, entry["run"], selection, analysis_dir=f"results/{analysis}")

    def importing(self, run: str) -> str:
        """The analysis whose hf_checkpoints are imported into runs/``run``."""
        return next(a for a in self.imports if Path(self.analyses[a]["run"]).name == run)

    def import_inputs(self, run: str) -> list[str]:
        """The checkpoints' config.json files, and the cache receipt when the workflow prepares it."""
        analysis = self.importing(run)
        cache = [f"cache/{c}.prepared.json" for c, a in self.analysis_caches.items() if a == analysis]
        return [str(Path(c["path"]) / "config.json") for c in self.analyses[analysis]["hf_checkpoints"]] + cache

    @property
    def imported_runs(self) -> list[str]:
        """Names of the run directories (runs/<name>) the workflow imports hf_checkpoints into."""
        return [Path(self.analyses[a]["run"]).name for a in self.imports]

    def _check_analysis(self, name: str) -> AnalysisSettings:
        """An analysis's settings, and its output directory checked against them before any work."""
        entry = self.analyses[name]
        settings = settings_from_dict(self.settings_dict(name))
        run = self.trained_here(name)
        writes = None
        if run is not None:
            training = self.run_configs[run].training
            interval = training.checkpoint_policy == "interval"
            writes = {FINAL, *(epoch_file(e) for e in range(training.epochs + 1) if interval)}
        check_selection(f"analyses.{name}.checkpoints", entry["run"], entry.get("checkpoints", "all"), writes)
        check_output_binding(f"results/{name}", output_binding(settings, entry["run"], entry.get("spectrum", {})))
        spectrum = entry.get("spectrum") or {}
        if spectrum.get("enabled"):
            try:
                sharded_engine(settings, spectrum_settings_from_dict(spectrum))
            except ValueError as error:
                raise ValueError(f"analyses.{name}.{error}") from None
        self._check_offset(name, settings)
        return settings

    def _check_offset(self, name: str, settings: AnalysisSettings) -> None:
        """An offset epoch that reaches past a cache already prepared is refused at start-up."""
        if "offset" not in self.cases(name):
            return
        try:
            run = self.run_config(name)
            cache = TokenCache(run.data.cache)
        except (ValueError, OSError):
            return  # not there yet: the analysis checks it when it runs
        offset_plan(run, cache, settings.data_offset, key=f"analyses.{name}.settings.data_offset")

    def check_ranks(self, analyses: Iterable[str]) -> None:
        """Ranks of jobs that run on this machine: several nodes need a Slurm allocation, and N CPU
        processes need N usable cores (N GPUs: N CUDA devices).

        Raises:
            ValueError: naming the key and what to set instead.
        """
        import os

        for name in analyses:
            ranks = self.ranks(name)
            if ranks["nodes"] > 1 and not os.environ.get("SLURM_JOB_NODELIST"):
                raise ValueError(
                    f"analyses.{name}.nodes_per_job: {ranks['nodes']} nodes need a Slurm allocation "
                    "(run with --profile profiles/naiss, or inside salloc); set 1 to run here"
                )
            if ranks["gpus"] <= 1:
                continue
            device = self.analysis_settings[name].device
            cuda = device.startswith("cuda") or (device == "auto" and _cuda_devices() > 0)
            usable = (
                _cuda_devices()
                if cuda
                else len(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity")
                else (os.cpu_count() or 1)
            )
            if ranks["gpus"] > usable:
                what = "CUDA devices" if cuda else "usable CPU cores"
                raise ValueError(
                    f"analyses.{name}.gpus_per_job: {ranks['gpus']} ranks per job, but this machine has "
                    f"{usable} {what}; set at most {usable} to run here (on the cluster each rank is a "
                    "GPU)"
                )

    def check_devices(self, train: bool, analyses: Iterable[str]) -> None:
        """For jobs that run on this machine (not on a cluster's nodes): refuse a CUDA device it
        does not have, naming the key (``train_device`` when ``train``ing; ``settings.device`` of
        each of ``analyses``, those this run computes).

        Raises:
            ValueError: naming the key and what to set instead.
        """
        if train:
            check_device("train_device", self.train_device)
        analyses = list(analyses)
        for name in analyses:
            where = "settings_override" if "device" in self.settings_override else f"analyses.{name}.settings"
            check_device(f"{where}.device", self.analysis_settings[name].device)
        self.check_ranks(analyses)

    def memory(self, analysis: str) -> MemoryPlan | None:
        """The memory plan of the analysis's (state, case) jobs under ``memory_budget_gb`` (none
        when unset: on CUDA the budget is then the free memory at run time); None while the run's
        configuration is not there yet.

        Raises:
            ValueError: a pass that does not fit the budget even one sequence at a time.
        """
        settings = self.analysis_settings[analysis]
        try:
            run = self.run_config(analysis)
        except (ValueError, OSError):
            return None
        budget = None if settings.memory_budget_gb is None else int(settings.memory_budget_gb * GiB)
        return memory_plan(settings, run, budget, cuda=settings.device.startswith("cuda"))

    # --- targets ----------------------------------------------------------------------------

    def all_targets(self) -> list[str]:
        """Every run and figure, and every (state, case) result of an existing index.

        Naming the results makes a deleted result count as missing (Snakemake does not rerun a
        deleted intermediate file whose consumers are up to date), so a rerun recomputes exactly
        what was lost. The index is read directly when present (before the first run the figures
        pull in every result through collect), which keeps the first dry run's plan complete.
        """
        targets = [f"runs/{name}/trained.json" for name in self.run_configs]
        targets += self.experiment_targets()
        for name in self.analyses:
            # The collected files too: a crash during collect (or their deletion) reruns collect.
            targets += [f"results/{name}/manifest.json", f"results/{name}/summary.csv"]
            figures = list(FIGURES) + (AUDIT_FIGURES if self.analysis_settings[name].audited else [])
            if self.spectrum_enabled(name):
                targets.append(f"results/{name}/spectrum.csv")
                figures += SPECTRUM_FIGURES
            # A walltime waiting for a calibration: the short calibration job starts at once.
            if self.calibration_pending(name):
                targets.append(f"results/timing/{name}.json")
            targets += [f"results/{name}/figures/{figure}.{ext}" for figure in figures for ext in ("pdf", "png")]
            index = Path(f"results/{name}/states.json")
            if index.exists() and not self.calibration_pending(name):
                targets += [
                    state_result(name, state["key"], case)
                    for state in json.loads(index.read_text())["states"]
                    for case in self.cases(name)
                ]
        return targets

    def experiment_targets(self) -> list[str]:
        """comparison.csv and the dashboard of every experiment, and every comparison's figure."""
        targets = []
        for name in self.seed_experiments:
            targets.append(f"results/{name}/comparison.csv")
            if self.geometry_calibration_pending(name):  # the short calibration job starts at once
                targets.append(f"results/timing/{name}.json")
            targets += [f"results/{name}/figures/dashboard.{ext}" for ext in ("pdf", "png")]
        for name in self.seed_comparisons:
            targets += [f"results/comparisons/{name}/comparison.{ext}" for ext in ("pdf", "png")]
        return targets

    # --- data and training ------------------------------------------------------------------

    def cache_spec(self, cache: str) -> dict[str, Any]:
        """Everything that determines a cache's contents (a change reruns prepare_data)."""
        if cache in self.analysis_caches:
            analysis = self.analysis_caches[cache]
            entry, tokenizer = self.analyses[analysis], self._analysis_tokenizer(analysis)
            return {
                "cache_source": entry.get("cache_source", "text"),
                "cache_inputs": entry["cache_inputs"],
                "shard_tokens": entry.get("shard_tokens", 1 << 20),
                "data": config_to_dict(self.imports[analysis].data),
                "keep_order": entry.get("cache_order", "shuffle") == "keep",
                "capacity": None,
                **({"tokenizer": tokenizer} if tokenizer else {}),
            }
        name = self.run_of_cache[cache]
        entry, run = self.train_runs[name], self.run_configs[name]
        source = entry.get("cache_source", "demo")
        return {
            "cache_source": source,
            "cache_inputs": entry.get("cache_inputs", []),
            "shard_tokens": entry.get("shard_tokens", 1 << 20),
            "data": config_to_dict(run.data),
            "keep_order": entry.get("cache_order", "shuffle") == "keep",
            "capacity": default_capacity(run) if source == "demo" else None,
            **({"tokenizer": entry["cache_tokenizer"]} if entry.get("cache_tokenizer") else {}),
        }

    def cache_receipt(self, run: str) -> str:
        """The receipt of the cache a run reads (prepare_data's output)."""
        return f"cache/{self.cache_of_run[run]}.prepared.json"

    def cache_inputs(self, cache: str) -> list[str]:
        if cache in self.analysis_caches:
            return list(self.analyses[self.analysis_caches[cache]]["cache_inputs"])
        return self.train_runs[self.run_of_cache[cache]].get("cache_inputs", [])

    @property
    def caches(self) -> list[str]:
        """Every cache the workflow prepares: the trained runs' and the hf_checkpoints analyses'."""
        return [*self.run_of_cache, *self.analysis_caches]

    # --- analyses ---------------------------------------------------------------------------

    def trained_here(self, analysis: str) -> str | None:
        """The train_runs name of an analysis's run when this workflow trains it, else None."""
        run = Path(self.analyses[analysis]["run"])
        return run.name if run.parent == Path("runs") and run.name in self.run_configs else None

    def run_ready(self, analysis: str) -> str:
        """The trained run's receipt when the workflow trains it, the import's when it imports it,
        else its resolved.yaml."""
        name = self.trained_here(analysis)
        if name:
            return f"runs/{name}/trained.json"
        run = Path(self.analyses[analysis]["run"])
        return str(run / IMPORTED) if analysis in self.imports else str(run / RESOLVED)

    def calibration_inputs(self, analysis: str) -> list[str]:
        """Calibration needs only the run's shapes: a run trained here is not waited for."""
        return [] if self.trained_here(analysis) else [self.run_ready(analysis)]

    def run_config(self, analysis: str) -> RunConfig:
        name = self.trained_here(analysis)
        if name:
            return self.run_configs[name]
        resolved = Path(self.analyses[analysis]["run"]) / RESOLVED
        return self.imports[analysis] if analysis in self.imports and not resolved.exists() else load_config(resolved)

    def settings_dict(self, analysis: str) -> dict[str, Any]:
        """An analysis's settings as configured; a profile's ``settings_override`` wins."""
        return {**self.analyses[analysis].get("settings", {}), **self.settings_override}

    def binding(self, analysis: str) -> dict[str, Any]:
        entry = self.analyses[analysis]
        return output_binding(self.analysis_settings[analysis], entry["run"], entry.get("spectrum", {}))

    def cases(self, analysis: str) -> list[str]:
        entry = self.analyses[analysis]
        if "cases" in entry:
            return entry["cases"]
        imported = (
            analysis in self.imports or (Path(entry["run"]) / IMPORTED).exists() and not self.trained_here(analysis)
        )
        return ["offset"] if imported else ["seen", "unseen"]

    def selection(self, analysis: str) -> str | list[str]:
        """The analysis's checkpoints: ``all`` or a list of root checkpoint files."""
        return self.analyses[analysis].get("checkpoints", "all")

    def ranks(self, analysis: str) -> dict[str, int]:
        """How each (state, case) job of an analysis runs: ``gpus`` processes per node (GPUs on the
        cluster, CPU processes locally) on ``nodes`` nodes."""
        entry = self.analyses[analysis]
        return {"gpus": int(entry.get("gpus_per_job", 1)), "nodes": int(entry.get("nodes_per_job", 1))}

    def job_ranks(self, analysis: str) -> int:
        """Ranks of one (state, case) job: ``gpus_per_job`` on each of ``nodes_per_job`` nodes."""
        ranks = self.ranks(analysis)
        return ranks["gpus"] * ranks["nodes"]

    def gpus_requested(self, analysis: str) -> int:
        """GPUs one (state, case) job holds: every rank's, over its nodes (none on a CPU device)."""
        return 0 if self.analysis_settings[analysis].device == "cpu" else self.job_ranks(analysis)

    def spectrum_enabled(self, analysis: str) -> bool:
        return bool(self.analyses[analysis].get("spectrum", {}).get("enabled", False))

    def state_checkpoint(self, analysis: str, state: dict[str, Any]) -> str:
        """The state's first alias: the file the worker measures (the others are identical). The
        index holds names relative to the run, so a moved or copied project still finds them."""
        return str(Path(self.analyses[analysis]["run"]) / state["aliases"][0]["file"])

    def state_results(self, analysis: str, key: str) -> list[str]:
        """Every result of one state: noise statistics, and spectra when enabled (one group job)."""
        kinds = ["states"] + (["spectra"] if self.spectrum_enabled(analysis) else [])
        return [f"results/{analysis}/{kind}/{key}/{case}.json" for kind in kinds for case in self.cases(analysis)]

    # --- seed experiments -------------------------------------------------------------------

    def experiment_checkpoints(self, run: str) -> list[str]:
        """The interval checkpoints a run of an experiment writes: epoch-000 (initialisation) to the last epoch."""
        return [epoch_stem(i) for i in range(self.run_configs[run].training.epochs + 1)]

    def experiment_records(self, experiment: str) -> list[str]:
        return [
            f"results/{experiment}/geometry/{run}/{checkpoint}.json"
            for run in self.experiment_runs[experiment]
            for checkpoint in self.experiment_checkpoints(run)
        ]

    def reference_run(self, experiment: str) -> str:
        return next(iter(self.experiment_runs[experiment]))

    def geometry_settings_dict(self, experiment: str) -> dict[str, Any]:
        """The experiment's measurement settings; a profile's device and dtype win (as for analyses)."""
        imposed = {key: self.settings_override[key] for key in ("device", "dtype") if key in self.settings_override}
        return {**self.seed_experiments[experiment].get("settings", {}), **imposed}

    def calibration_settings(self, experiment: str) -> AnalysisSettings:
        """The analysis setup whose timing entry prices the experiment's measurements."""
        return as_analysis_settings(geometry_settings_from_dict(self.geometry_settings_dict(experiment)))

    def geometry_calibration_pending(self, experiment: str) -> bool:
        """Whether an experiment's measurement walltimes wait for its calibration job: walltimes are
        estimated and no timing entry covers the measurement setup yet."""
        return self._pending_for(experiment, self._geometry_timing_entry)

    def geometry_runtime(self, experiment: str) -> int:
        """Minutes for one checkpoint's measurement: ``cluster.walltime_hours`` when set; under
        ``cluster.walltime: estimate``, 2 × estimated work + 30 min rounded up to the hour from the
        timing entry of the setup (measured first by calibrate_geometry when there is none: the
        measurement jobs are planned after it); else the experiment's ``walltime_minutes``."""
        if self.cluster.get("walltime_hours"):
            return int(self.cluster["walltime_hours"] * 60)
        if self.cluster.get("walltime") == "estimate":
            entry = self._geometry_timing_entry(experiment)
            if entry is not None:
                settings = geometry_settings_from_dict(self.geometry_settings_dict(experiment))
                run = self.run_configs[self.reference_run(experiment)]
                return cost.job_minutes(measurement_seconds(run, settings, entry["seconds"]))
        return self.seed_experiments[experiment].get("walltime_minutes", 60)

    def _geometry_timing_entry(self, experiment: str) -> dict[str, Any] | None:
        run = self.run_configs[self.reference_run(experiment)]
        return self._lookup(run, self.calibration_settings(experiment), self.cluster.get("gpu_kind"))

    # --- walltimes and calibration ------------------------------------------------------------

    def _lookup(self, run: RunConfig, settings: AnalysisSettings, device_kind: str | None) -> dict[str, Any] | None:
        key = timing.timing_key(run, settings, device_kind="")
        return timing.lookup_entry(timing.load_profiles(self.cluster["timing_profiles"]), key, device_kind)

    def timing_entry(self, analysis: str, device_kind: str | None) -> dict[str, Any] | None:
        """The timing entry measured for an analysis's setup on a device whose kind contains
        ``device_kind`` (any when None), from ``cluster.timing_profiles``; None when there is none."""
        return self._lookup(self.run_config(analysis), self.analysis_settings[analysis], device_kind)

    def _pending_for(self, name: str, entry_of: Callable[[str], dict[str, Any] | None]) -> bool:
        """Decided once per workflow run (analysis and experiment names never coincide)."""
        if name not in self._pending:
            estimate = self.cluster.get("walltime") == "estimate" and not self.cluster.get("walltime_hours")
            self._pending[name] = estimate and entry_of(name) is None
        return self._pending[name]

    def calibration_pending(self, analysis: str) -> bool:
        """Whether the walltime estimate of an analysis waits for its calibration job: walltimes are
        estimated and no timing entry (committed, or measured by an earlier calibration of any
        analysis with the same setup) covers it yet. Decided once per workflow run."""
        return self._pending_for(analysis, self._analysis_timing_entry)

    def _analysis_timing_entry(self, analysis: str) -> dict[str, Any] | None:
        return self.timing_entry(analysis, self.cluster.get("gpu_kind"))

    def calibration(self, analysis: str) -> list[str]:
        """The calibration an analysis job's walltime waits for (none when a timing entry exists)."""
        return [f"results/timing/{analysis}.json"] if self.calibration_pending(analysis) else []

    def geometry_calibration(self, experiment: str) -> list[str]:
        return [f"results/timing/{experiment}.json"] if self.geometry_calibration_pending(experiment) else []

    def case_work_seconds(self, analysis: str) -> float | None:
        """Estimated work of one (state, case) job from the timing profiles, or None (no estimate).

        Raises:
            ValueError: walltimes are estimated and no timing entry covers the setup.
        """
        if self.cluster.get("walltime", "none") != "estimate":
            return None
        run, settings = self.run_config(analysis), self.analysis_settings[analysis]
        entry = self.timing_entry(analysis, self.cluster.get("gpu_kind"))
        if entry is None:
            key = timing.timing_key(run, settings, device_kind="")
            raise ValueError(
                f"no timing profile covers analysis {analysis} ({key}); run "
                "`snakemake --profile <profile> calibrate` on the target node first, or set "
                "cluster.walltime_hours to request an explicit walltime"
            )
        workers = run.training.workers if settings.consensus else 0
        one = cost.estimate_seconds(run, settings, entry["seconds"], workers=workers if workers > 1 else 0)
        return cost.parallel_seconds(one, self.job_ranks(analysis))

    def _explicit_minutes(self, analysis: str) -> tuple[int, int]:
        """``cluster.walltime_hours`` as minutes per state job, split over its group's jobs: each
        case gets an equal share, finish_state the rest (at least one minute; none is ever 0)."""
        total = int(self.cluster["walltime_hours"] * 60)
        cases = len(self.cases(analysis))
        share = max(1, (total - 1) // cases)
        return share, max(1, total - cases * share)

    def analyze_runtime(self, analysis: str) -> int:
        """Minutes for one (state, case): 2 × estimated work; the group's rounding and the 30-minute
        margin are carried by finish_state (see :meth:`finish_runtime`). Analysis jobs exist only
        after the index, which waits for a pending calibration, so its timings are there."""
        if self.cluster.get("walltime_hours"):
            return self._explicit_minutes(analysis)[0]
        work = self.case_work_seconds(analysis)
        return 60 if work is None else math.ceil(2 * work / 60)

    def finish_runtime(self, analysis: str) -> int:
        """Completes the group of one state to 2 × work + 30 min, rounded up to the hour (≤ 72 h):
        a group job's runtime is the sum of its jobs' runtimes (they run one after another)."""
        if self.cluster.get("walltime_hours"):
            return self._explicit_minutes(analysis)[1]
        work = self.case_work_seconds(analysis)
        if work is None:
            return 5
        cases = len(self.cases(analysis))
        return cost.job_minutes(cases * work) - cases * math.ceil(2 * work / 60)

    # --- before a run ---------------------------------------------------------------------------

    def cost_line(self, analysis: str) -> str | None:
        """What an unfinished analysis will cost: jobs, the work of each, and the estimated time
        (None for an existing run without resolved.yaml: refused later, with its reason)."""
        settings = self.analysis_settings[analysis]
        try:
            run = self.run_config(analysis)
        except ValueError:
            return None
        states = self._expected_states(analysis, run)
        workers = run.training.workers if settings.consensus else 0
        work = cost.case_work(run, settings, workers)
        kind = "cpu" if settings.device == "cpu" else self.cluster.get("gpu_kind") or "cuda"
        line = cost.cost_line(
            analysis,
            states,
            self.cases(analysis),
            work,
            settings.device,
            self.timing_entry(analysis, kind),
            self.cluster,
            self.job_ranks(analysis),
        )
        memory = self.memory(analysis).describe()
        if settings.memory_budget_gb is None and settings.device != "cpu":
            memory = memory.replace("no budget", "budget: the GPU's free memory at run time, cut to fit")
        return f"{line}; {memory}"

    def cost_lines(self, train_minutes: int | None = None, calibration_minutes: int | None = None) -> list[str]:
        """The cost line of every analysis that has no summary.csv yet and of every seed experiment
        without its comparison, and under a cluster walltime rule the campaign's total request
        (``train_minutes`` and ``calibration_minutes``: the walltimes the profile asks for those jobs)."""
        lines = [self.cost_line(name) for name in self.analyses if not Path(f"results/{name}/summary.csv").exists()]
        lines += [
            self.experiment_cost_line(name)
            for name in self.seed_experiments
            if not Path(f"results/{name}/comparison.csv").exists()
        ]
        lines.append(self.campaign_line(train_minutes, calibration_minutes))
        return [line for line in lines if line]

    def _requested_hours(self, analysis: str) -> float | None:
        """GPU-hours Slurm is asked for by an analysis's state jobs (None before its calibration)."""
        try:
            run = self.run_config(analysis)
        except ValueError:
            return None
        count = self._expected_states(analysis, run)[0]
        gpus = self.job_ranks(analysis)
        if self.cluster.get("walltime_hours"):
            return count * float(self.cluster["walltime_hours"]) * gpus
        timing_entry = self.timing_entry(analysis, self.cluster.get("gpu_kind"))
        if timing_entry is None:
            return None
        settings = self.analysis_settings[analysis]
        workers = run.training.workers if settings.consensus else 0
        each = cost.parallel_seconds(cost.case_work(run, settings, workers).seconds(timing_entry["seconds"]), gpus)
        return count * cost.job_minutes(len(self.cases(analysis)) * each) / 60 * gpus

    def experiment_cost_line(self, experiment: str) -> str:
        """What a seed experiment will cost: runs × checkpoints measured, and the time."""
        runs = self.experiment_runs[experiment]
        checkpoints = sum(len(self.experiment_checkpoints(run)) for run in runs)
        settings = geometry_settings_from_dict(self.geometry_settings_dict(experiment))
        run = self.run_configs[self.reference_run(experiment)]
        work = measurement_work(run, settings)
        line = (
            f"seed experiment {experiment}: {len(runs)} runs (seeds and controls) trained, {checkpoints} checkpoint "
            f"measurements; each: {work['gradient_microbatches']} gradient micro-batches, at most "
            f"{work['hvp_microbatch_passes']} curvature micro-batch passes"
        )
        entry = self._geometry_timing_entry(experiment)
        if entry is None:
            return line + f"; time: no timing entry for this setup on {settings.device}"
        each = measurement_seconds(run, settings, entry["seconds"])
        kind = (entry.get("key") or {}).get("device_kind", settings.device)
        return (
            line + f"; at most about {cost.format_seconds(each)} each, {cost.format_seconds(checkpoints * each)} "
            f"in all on {settings.device} (timings measured on {kind}, {entry.get('measured', {}).get('at', '?')[:10]})"
        )

    def campaign_line(self, train_minutes: int | None, calibration_minutes: int | None) -> str | None:
        """Under a cluster walltime rule: every GPU-hour the campaign asks Slurm for, training and
        calibration included (None for local runs)."""
        if not (self.cluster.get("walltime_hours") or self.cluster.get("walltime") == "estimate"):
            return None
        untrained = [run for run in self.run_configs if not Path(f"runs/{run}/trained.json").exists()]
        open_analyses = [a for a in self.analyses if not Path(f"results/{a}/summary.csv").exists()]
        calibrations = [a for a in open_analyses if self.calibration_pending(a)] + [
            e for e in self.seed_experiments if self.geometry_calibration_pending(e)
        ]
        hours = {a: self._requested_hours(a) for a in open_analyses}
        parts, total = [], 0.0
        if untrained:
            each = (train_minutes or 0) / 60
            parts.append(
                f"training {len(untrained)} run(s) × {each:g} h"
                if train_minutes
                else f"training {len(untrained)} run(s) (walltime not set by the profile)"
            )
            total += len(untrained) * each
        if calibrations:
            each = (calibration_minutes or 60) / 60
            parts.append(f"calibration {len(calibrations)} job(s) × {each:g} h")
            total += len(calibrations) * each
        known = {a: h for a, h in hours.items() if h is not None}
        if known:
            parts.append(f"analyses {sum(known.values()):g} GPU-hours")
            total += sum(known.values())
        measurements = sum(
            len(self.experiment_checkpoints(r))
            for e in self.seed_experiments
            for r in self.experiment_runs[e]
            if not Path(f"results/{e}/comparison.csv").exists()
        )
        if measurements:
            experiment_hours = sum(
                len(self.experiment_checkpoints(r)) * self.geometry_runtime(e) / 60
                for e in self.seed_experiments
                for r in self.experiment_runs[e]
                if not Path(f"results/{e}/comparison.csv").exists()
            )
            parts.append(f"seed experiments {experiment_hours:g} GPU-hours")
            total += experiment_hours
        if not parts:
            return None
        unknown = sorted(a for a, h in hours.items() if h is None)
        later = f" (+ {', '.join(unknown)}: priced by its calibration)" if unknown else ""
        return f"campaign on Slurm: {' + '.join(parts)} = at most {total:g} GPU-hours requested{later}"

    def walltime_rule(self) -> str:
        if self.cluster.get("walltime_hours"):
            return f"cluster.walltime_hours: {self.cluster['walltime_hours']} per state job"
        if self.cluster.get("walltime") == "estimate":
            return "2 x estimated work + 30 min per state job, rounded up to the hour"
        return "none (local run, or the profile's default)"

    def start_event(self, analysis: str, command: list[str], source: str) -> dict[str, Any]:
        """The campaign record's start event of an analysis for this controller run."""
        try:
            entry = self.timing_entry(analysis, self.cluster.get("gpu_kind"))
        except ValueError:
            entry = None
        return {
            "event": "start",
            "command": command,
            "source": source,
            "cost": self.cost_line(analysis),
            "walltime": self.walltime_rule(),
            "timing_entry": entry,
            "settings": settings_record(self.analysis_settings[analysis]),
        }
