"""The runs and caches of a workflow: the runs it trains (``train_runs`` and the runs each seed
experiment expands to), the Hugging Face checkpoint lists it imports (an analysis's
``hf_checkpoints``, checked before any work), and the token caches it prepares for both, with what
determines each cache's contents.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tiny_llm.campaign.checks import check_tokenizer_directory, expand_seed_experiments, load_run_config
from tiny_llm.config import RunConfig, config_to_dict
from tiny_llm.data.corpus import default_capacity, describe_tokenizer, same_tokenizer
from tiny_llm.model.hf import imported_config
from tiny_llm.model.hf_positions import checkpoint_positions
from tiny_llm.model.hf_runs import checkpoint_tokenizer

__all__ = ["Runs"]


class Runs:
    """A workflow's runs, imports and caches.

    Raises:
        ValueError: naming the config key of a run, import or cache that cannot work.
    """

    def __init__(self, config: dict[str, Any], analyses: dict[str, Any], seed_experiments: dict[str, Any]):
        self.analyses = analyses
        self.train_runs, self.experiment_runs = expand_seed_experiments(
            seed_experiments, dict(config.get("train_runs") or {}), analyses
        )
        self.run_configs = {name: load_run_config(entry) for name, entry in self.train_runs.items()}
        self.imports = {name: self._check_import(name) for name, entry in analyses.items() if "hf_checkpoints" in entry}
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
            if analyses[name].get("cache_inputs"):
                self.analysis_caches[self._analysis_cache(name, planned)] = name

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
            **({"adapter": True} if entry.get("adapter") else {}),  # absent when false: earlier imports stand
        }

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
