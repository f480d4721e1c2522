# Configuration checks and named input functions shared by every rule.
from pathlib import Path

from snakemake.utils import validate

from tiny_llm.config import apply_overrides, config_from_dict, config_to_dict, load_config_dict
from tiny_llm.corpus import default_capacity


validate(config, schema="../schemas/config.schema.yaml")


def _load_run_config(name):
    entry = config["train_runs"][name]
    overrides = [f"{key}={value}" for key, value in entry["set"].items()]
    return config_from_dict(apply_overrides(load_config_dict(entry["config"]), overrides))


RUN_CONFIGS = {name: _load_run_config(name) for name in config["train_runs"]}
CACHE_OF_RUN = {}
for _name, _run in RUN_CONFIGS.items():
    _cache = Path(_run.data.cache)
    if _cache.parent != Path("cache"):
        raise ValueError(
            f"train_runs.{_name}: data.cache must be cache/<name> for the workflow to prepare it, got {_cache}"
        )
    CACHE_OF_RUN[_name] = _cache.name
RUN_OF_CACHE = {}
for _name, _cache in CACHE_OF_RUN.items():
    RUN_OF_CACHE.setdefault(_cache, _name)


wildcard_constraints:
    run="|".join(RUN_CONFIGS) or "NONE",
    cache="|".join(RUN_OF_CACHE) or "NONE",


def get_all_targets():
    return [f"runs/{name}/trained.json" for name in RUN_CONFIGS]


def get_cache_receipt(wildcards):
    return f"cache/{CACHE_OF_RUN[wildcards.run]}.prepared.json"




def get_run_config_dict(wildcards):
    return config_to_dict(RUN_CONFIGS[wildcards.run])


def get_cache_spec(wildcards):
    """Everything that determines a cache's contents (a change reruns prepare_data)."""
    name = RUN_OF_CACHE[wildcards.cache]
    entry = config["train_runs"][name]
    spec = {key: entry[key] for key in ("cache_source", "cache_inputs", "shard_tokens")}
    spec["data"] = config_to_dict(RUN_CONFIGS[name].data)
    spec["capacity"] = default_capacity(RUN_CONFIGS[name]) if entry["cache_source"] == "demo" else None
    return spec


def get_cache_inputs(wildcards):
    return config["train_runs"][RUN_OF_CACHE[wildcards.cache]]["cache_inputs"]
