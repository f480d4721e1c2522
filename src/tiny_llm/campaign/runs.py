"""The runs and caches of a workflow: the runs it trains (``train_runs`` and the runs each seed
experiment expands to), the Hugging Face checkpoint lists it imports (an analysis's
``hf_checkpoints``, and each seed's list of a seed experiment of models trained elsewhere, checked
before any work), and the token caches it prepares for both, with what determines each cache's
contents.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from tiny_llm.campaign.checks import (
    check_tokenizer_directory,
    expand_seed_experiments,
    expand_seed_imports,
    in_folder,
    load_run_config,
)
from tiny_llm.config import ModelConfig, RunConfig, config_to_dict
from tiny_llm.data.corpus import default_capacity, describe_tokenizer, same_tokenizer
from tiny_llm.model.hf import imported_config
from tiny_llm.model.hf_positions import CheckpointPosition, CheckpointSource, as_written, checkpoint_positions
from tiny_llm.model.hf_runs import checkpoint_tokenizer
from tiny_llm.model.hub import expand_checkpoints
from tiny_llm.model.integrity import identical_findings, refuse_identical, weights_digest

__all__ = ["Runs"]


def _shape(model: ModelConfig) -> str:
    """A model's shape in words, for messages."""
    return f"d_model {model.d_model}, {model.n_layers} layers, {model.n_heads} heads, vocabulary {model.vocab_size}"


def _hub(checkpoints: list[dict[str, Any]]) -> bool:
    """Whether any checkpoint came from a hub revision (its import spec then records them)."""
    return any(c.get("revision") for c in checkpoints)


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
        seed_imports, imported_roles = expand_seed_imports(seed_experiments, self.train_runs, analyses)
        self.experiment_runs.update(imported_roles)
        self.run_configs = {name: load_run_config(entry) for name, entry in self.train_runs.items()}
        self.import_entries: dict[str, dict[str, Any]] = {
            **{name: entry for name, entry in analyses.items() if "hf_checkpoints" in entry},
            **seed_imports,
        }
        """What the workflow imports, by name: analyses of Hugging Face checkpoint lists, and the
        seeds of seed experiments of models trained elsewhere (named as their run)."""
        self.carried: dict[str, dict[str, Any] | None] = {}
        """The tokenizer each import's checkpoints carry."""
        self.positions: dict[str, list[CheckpointPosition]] = {}
        """Each import's checkpoints' steps and tokens."""
        self.integrity: dict[str, dict[str, list[dict[str, Any]]]] = {}
        """Each import's checkpoints whose weight files another step's repeat (by label)."""
        self.digests: dict[str, list[tuple[str, str]]] = {}
        """Each import's checkpoints' weight digests, by label (a study compares them across seeds)."""
        self.notes: list[str] = []
        """What planning left out and why (revisions before a case's window, aliases of one
        commit, revisions without a step), for the log."""
        self.imports = {name: self._check_import(name) for name in self.import_entries}
        """Each import: the run configuration importing it gives (its run directory: the entry's ``run``)."""
        self._check_seed_imports(seed_experiments)
        self.cache_of_run: dict[str, str] = {}
        for name, run in self.run_configs.items():
            need = "data.cache must be cache/<name> for the workflow to prepare it"
            self.cache_of_run[name] = in_folder(Path(run.data.cache), "cache", f"train_runs.{name}", need).name
        self.run_of_cache: dict[str, str] = {}
        for name, cache in self.cache_of_run.items():
            self.run_of_cache.setdefault(cache, name)
        self.analysis_caches: dict[str, str] = {}
        """Caches the workflow prepares for imports (``cache_inputs``) -> the import."""
        for name, planned in self.imports.items():
            if self.import_entries[name].get("cache_inputs"):
                self.analysis_caches[self._analysis_cache(name, planned)] = name

    def _owner(self, name: str) -> str:
        """The config key of an import's entry: ``analyses.<name>``, or its seed experiment's."""
        return self.import_entries[name].get("owner", f"analyses.{name}")

    def _key(self, name: str, field: str) -> str:
        """The config key of an import's ``field``, for messages (a seed's list under its seed)."""
        entry = self.import_entries[name]
        seed = f".{entry['seed']}" if field == "hf_checkpoints" and "seed" in entry else ""
        return f"{self._owner(name)}.{field}{seed}"

    def _check_import(self, name: str) -> RunConfig:
        """An import's ``hf_checkpoints``: its run directory (``run``, default runs/<name>) must be
        no trained run's, and the list must import (checked before any work, nothing written).

        Raises:
            ValueError: naming the config key.
        """
        entry = self.import_entries[name]
        entry.setdefault("run", f"runs/{name}")
        need = "the workflow imports hf_checkpoints into runs/<name>"
        run = in_folder(Path(entry["run"]), "runs", self._key(name, "run"), need)
        if run.name in self.run_configs:
            raise ValueError(
                f"{self._key(name, 'run')}: {run} is trained by train_runs.{run.name}; import the "
                "hf_checkpoints into another run directory"
            )
        if "config" not in entry:
            raise ValueError(
                f"{self._key(name, 'config')}: hf_checkpoints need a run configuration (its data section "
                "names the prepared cache; training.batch_size, micro_batch_size, tokens and epochs "
                "cut the offset epoch)"
            )
        try:  # a suite or revisions in the local Hugging Face cache: their folders, once
            key, first = self._key(name, "hf_checkpoints"), _first_trained_step(entry)
            entry["hf_checkpoints"] = expand_checkpoints(entry["hf_checkpoints"], key, None, first, self.notes)
            sources = [CheckpointSource.from_entry(c) for c in entry["hf_checkpoints"]]
            paths = [s.path for s in sources]
            run = _import_run_config(entry)
            planned = imported_config(paths, run, adapter=bool(entry.get("adapter")))
            self._order_tokens_per_step(name, planned)
            self.positions[name] = checkpoint_positions(sources, entry.get("tokens_per_step"))
            self._check_integrity(name, sources)
            carried = checkpoint_tokenizer(paths, planned.model.vocab_size)
        except ValueError as error:
            raise ValueError(f"{self._key(name, 'hf_checkpoints')}: {_as_written(str(error), entry)}") from None
        if entry.get("cache_tokenizer"):
            key = self._key(name, "cache_tokenizer")
            check_tokenizer_directory(key, entry["cache_tokenizer"], planned.model.vocab_size)
        self._check_cache_tokenizer(name, planned, carried)
        self.carried[name] = carried
        return planned

    def _check_seed_imports(self, seed_experiments: dict[str, Any]) -> None:
        """The seeds of an experiment of models trained elsewhere are measured on one cache and
        compared parameter by parameter at equal steps, so each lists its own folders, and they carry
        one tokenizer, one architecture and shape, and the same steps."""
        for name, entry in seed_experiments.items():
            if "hf_checkpoints" not in entry:
                continue
            first, *others = list(self.experiment_runs[name])
            self._check_own_folders([first, *others])
            for run in others:
                key = self._key(run, "hf_checkpoints")
                if not same_tokenizer(self.carried[first], self.carried[run]):
                    raise ValueError(
                        f"{key}: its checkpoints carry {describe_tokenizer(self.carried[run])}, the first seed's "
                        f"{describe_tokenizer(self.carried[first])}; the seeds of one experiment are "
                        "measured on one cache, encoded with one tokenizer"
                    )
                ours, theirs = (replace(self.imports[r].model, hf_config=None) for r in (run, first))
                if ours != theirs:
                    raise ValueError(
                        f"{key}: its model ({ours.architecture}, {_shape(ours)}) is not the first seed's "
                        f"({theirs.architecture}, {_shape(theirs)}); the seeds of one experiment are "
                        "compared parameter by parameter, so they share one architecture and shape"
                    )
                steps, expected = ([p.step for p in self.positions[r]] for r in (run, first))
                if steps != expected:
                    raise ValueError(
                        f"{key}: its checkpoints are at steps {steps}, the first seed's at {expected}; the seeds "
                        "are compared at equal steps, so list the same steps for every seed"
                    )

    def _check_own_folders(self, runs: list[str]) -> None:
        """No checkpoint folder is listed for two seeds (nor twice for one: checkpoint_positions)."""
        owner: dict[Path, str] = {}
        for run in runs:
            for checkpoint in self.import_entries[run]["hf_checkpoints"]:
                folder = Path(checkpoint["path"]).resolve()
                if folder in owner and owner[folder] != run:
                    raise ValueError(
                        f"{self._key(run, 'hf_checkpoints')}: {checkpoint['path']} is listed for seed "
                        f"{self.import_entries[owner[folder]]['seed']} too; each seed's checkpoints are its own "
                        "folders"
                    )
                owner[folder] = run

    def _analysis_cache(self, name: str, planned: RunConfig) -> str:
        """The cache an import with ``cache_inputs`` has the workflow prepare: its data.cache,
        cache/<name> of no trained run."""
        key, need = (
            self._key(name, "config"),
            "with cache_inputs the workflow prepares data.cache, which must be cache/<name>",
        )
        cache = in_folder(Path(planned.data.cache), "cache", key, need)
        if cache.name in self.run_of_cache:
            raise ValueError(
                f"{key}: data.cache {cache} is prepared for train_runs."
                f"{self.run_of_cache[cache.name]}; name another cache/<name>"
            )
        if cache.name in self.analysis_caches:
            raise ValueError(
                f"{key}: data.cache {cache} is prepared for "
                f"{self._owner(self.analysis_caches[cache.name])} too; "
                "name another cache/<name>"
            )
        return cache.name

    def _order_tokens_per_step(self, name: str, planned: RunConfig) -> None:
        """An import on a published training order without ``tokens_per_step`` takes the order's: its
        ``sequences_per_step`` × the tokens a sequence trains (``sequence_tokens`` − 1, by default
        ``data.seq_len``), said in the notes (a revision's name that states its tokens checks it)."""
        entry = self.import_entries[name]
        order = entry.get("training_order")
        if not isinstance(order, dict) or entry.get("tokens_per_step") or "sequences_per_step" not in order:
            return
        trained = int(order.get("sequence_tokens") or planned.data.seq_len + 1) - 1
        entry["tokens_per_step"] = int(order["sequences_per_step"]) * trained
        self.notes.append(
            f"{self._owner(name)}.tokens_per_step: {entry['tokens_per_step']:,} from its training_order "
            f"({order['sequences_per_step']} sequences a step × {trained} trained tokens each)"
        )

    def _analysis_tokenizer(self, name: str) -> str | None:
        """The tokenizer an hf_checkpoints analysis's cache is encoded with: ``cache_tokenizer``, by
        default the first checkpoint directory's own (when it has a tokenizer.json), else bytes."""
        entry = self.import_entries[name]
        if entry.get("cache_tokenizer"):  # checked with the import (_check_import)
            return entry["cache_tokenizer"]
        first = Path(entry["hf_checkpoints"][0]["path"])
        return str(first) if (first / "tokenizer.json").exists() else None

    def _check_cache_tokenizer(self, name: str, planned: RunConfig, carried: dict[str, Any] | None) -> None:
        """A prepared cache encoded with another tokenizer than the checkpoints carry is refused at
        start-up (the analysis would refuse it too, after the import); not for an analysis whose
        cases all read its training order (data.cache, by default the demo's, is then never read)."""
        entry, meta = self.import_entries[name], Path(planned.data.cache) / "meta.json"
        if "training_order" in entry and "offset" not in (entry.get("cases") or ()):
            return
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
                f"{self._key(name, 'config')}: the checkpoints carry {describe_tokenizer(carried)}, but "
                f"data.cache {planned.data.cache} was encoded with {describe_tokenizer(recorded)}; "
                f"{remedy}"
            )

    def _check_integrity(self, name: str, sources: list[CheckpointSource]) -> None:
        """Checkpoints of different steps with identical weight files are refused before any work
        (unless the entry's ``allow_identical_states``); what is found is kept per import."""
        labels = [s.revision or str(s.path) for s in sources]
        steps = [p.step for p in self.positions[name]]
        digests = [weights_digest(s.path) for s in sources]
        self.digests[name] = list(zip(labels, digests, strict=True))
        self.integrity[name] = identical_findings(labels, steps, digests)
        if not self.import_entries[name].get("allow_identical_states"):
            setting = f"{self._owner(name)}.allow_identical_states: true"
            refuse_identical(self.integrity[name], self._key(name, "hf_checkpoints"), setting)

    def import_spec(self, run: str) -> dict[str, Any]:
        """What the import of runs/``run`` (an import's hf_checkpoints) writes (a change imports again)."""
        entry = self.import_entries[self.importing(run)]
        checkpoints = entry["hf_checkpoints"]
        return {
            "directories": [c["path"] for c in checkpoints],
            "steps": [c.get("step") for c in checkpoints],
            "tokens": [c.get("tokens") for c in checkpoints],
            **({"hub": [[c.get("repo"), c.get("revision")] for c in checkpoints]} if _hub(checkpoints) else {}),
            "tokens_per_step": entry.get("tokens_per_step"),
            "config": config_to_dict(_import_run_config(entry)),
            **({"adapter": True} if entry.get("adapter") else {}),  # absent when false: earlier imports stand
            **({"allow_identical_states": True} if entry.get("allow_identical_states") else {}),
        }

    def importing(self, run: str) -> str:
        """The import (an analysis, or a seed of an experiment) whose hf_checkpoints go into runs/``run``."""
        return next(a for a in self.imports if Path(self.import_entries[a]["run"]).name == run)

    def import_inputs(self, run: str) -> list[str]:
        """The checkpoints' config.json files, and the cache receipt when the workflow prepares it."""
        analysis = self.importing(run)
        cache = [f"cache/{c}.prepared.json" for c, a in self.analysis_caches.items() if a == analysis]
        return [str(Path(c["path"]) / "config.json") for c in self.import_entries[analysis]["hf_checkpoints"]] + cache

    @property
    def imported_runs(self) -> list[str]:
        """Names of the run directories (runs/<name>) the workflow imports hf_checkpoints into."""
        return [Path(self.import_entries[a]["run"]).name for a in self.imports]

    def cache_spec(self, cache: str) -> dict[str, Any]:
        """Everything that determines a cache's contents (a change reruns prepare_data)."""
        if cache in self.analysis_caches:
            analysis = self.analysis_caches[cache]
            entry, tokenizer = self.import_entries[analysis], self._analysis_tokenizer(analysis)
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
        """The receipt of the cache a run reads (prepare_data's output; for an imported run whose
        cache the workflow does not prepare, the cache's meta.json)."""
        if run in self.cache_of_run:
            return f"cache/{self.cache_of_run[run]}.prepared.json"
        cache = Path(self.imports[self.importing(run)].data.cache)
        return f"cache/{cache.name}.prepared.json" if cache.name in self.analysis_caches else str(cache / "meta.json")

    def receipt(self, run: str) -> str:
        """What says a run is there: runs/<run>/imported.json for an import, else its trained.json."""
        return f"runs/{run}/imported.json" if run in self.imported_runs else f"runs/{run}/trained.json"

    def run_config(self, run: str) -> RunConfig:
        """A run's configuration: trained here, or what importing it gives."""
        return self.run_configs[run] if run in self.run_configs else self.imports[self.importing(run)]

    def cache_inputs(self, cache: str) -> list[str]:
        if cache in self.analysis_caches:
            return list(self.import_entries[self.analysis_caches[cache]]["cache_inputs"])
        return self.train_runs[self.run_of_cache[cache]].get("cache_inputs", [])

    def check_prepared(self, owners: dict[str, str]) -> None:
        """A cache an earlier run of the workflow prepared for other settings (another configuration's
        run on the same ``cache/<name>``) is refused, naming the entry that uses it (``owners``: a
        run's config key where it is not ``train_runs.<run>``), before Snakemake would delete its
        receipt: the finished targets of the other configuration keep theirs.

        Raises:
            ValueError: naming the key, the cache, what differs and what to do.
        """
        for cache, differ in self.prepared_elsewhere().items():
            if cache in self.analysis_caches:
                key = f"analyses.{self.analysis_caches[cache]}"
            else:
                run = self.run_of_cache[cache]
                key = owners.get(run, f"train_runs.{run}")
            raise ValueError(
                f"{key}: data.cache cache/{cache} was prepared with other settings ({', '.join(differ)}; "
                f"cache/{cache}.prepared.json); name another cache/<name> in its data.cache, or remove "
                f"cache/{cache} and its receipt to prepare it again (what used it is then redone)"
            )

    def prepared_elsewhere(self) -> dict[str, list[str]]:
        """The caches an earlier workflow run prepared for other settings than this plan's: the
        cache's name -> what differs (from the spec its receipt records; a receipt without one is
        taken as it is). Preparing one again would find the cache with other contents, after
        Snakemake deleted its receipt: refused at start-up instead."""
        found = {}
        for cache in self.caches:
            receipt = Path("cache") / f"{cache}.prepared.json"
            try:
                recorded = json.loads(receipt.read_text()).get("spec")
            except (OSError, ValueError, AttributeError):
                continue  # none yet, or not readable: prepare_data says what is wrong with it
            if recorded is None:
                continue
            spec = json.loads(json.dumps(self.cache_spec(cache)))  # as the receipt holds it (JSON)
            differ = sorted(k for k in spec.keys() | recorded.keys() if spec.get(k) != recorded.get(k))
            if differ:
                found[cache] = differ
        return found

    @property
    def caches(self) -> list[str]:
        """Every cache the workflow prepares: the trained runs' and the hf_checkpoints analyses'."""
        return [*self.run_of_cache, *self.analysis_caches]


def _first_trained_step(entry: dict[str, Any]) -> int:
    """The first step an analysis's selected revisions must have trained: its ``case_steps`` when
    a case reads the steps up to a checkpoint (``seen``, ``recent`` of a training order), else 0."""
    cases = set(entry.get("cases") or ())
    if "training_order" in entry and cases & {"seen", "recent"}:
        steps = entry.get("case_steps", 1)
        return steps if isinstance(steps, int) and not isinstance(steps, bool) else 1
    return 0


def _import_run_config(entry: dict[str, Any]) -> RunConfig:
    """The run configuration an import's entry gives; with a training order, its training batch
    (``training.batch_size``) is the order's ``sequences_per_step`` unless the file says otherwise."""
    order = entry.get("training_order")
    per_step = order.get("sequences_per_step") if isinstance(order, dict) else None
    batch = {"batch_size": per_step} if isinstance(per_step, int) and not isinstance(per_step, bool) else {}
    return load_run_config({"config": entry["config"], "set": entry.get("set", {})}, batch)


def _as_written(message: str, entry: dict[str, Any]) -> str:
    """A refusal naming a revision's snapshot folder names it as the configuration does too."""
    checkpoints = entry.get("hf_checkpoints")
    listed = checkpoints if isinstance(checkpoints, list) else []
    return as_written(message, [CheckpointSource.from_entry(c) for c in listed if isinstance(c, dict) and "path" in c])
