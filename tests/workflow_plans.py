"""A workflow configuration of one tiny run and one GPU analysis, with a timing entry for it: what
the campaign's planning tests (checks, costs, targets, walltimes, the workflow plan) share."""

import json
from pathlib import Path

import yaml

RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/tiny", "seq_len": 16, "shuffle_group_blocks": 4, "seed": 7},
    "training": {"batch_size": 4, "micro_batch_size": 2, "tokens": 512, "epochs": 2},
}
SETTINGS = {"noise_samples": 2, "random_samples": 2, "directions_per_pass": 4}
SECONDS = {"startup": 120.0, "gradient_microbatch": 0.5, "hvp_microbatch_pass": 40.0}
KEY = {
    "d_model": 8,
    "n_layers": 1,
    "n_heads": 2,
    "d_ff": 16,
    "vocab_size": 256,
    "seq_len": 16,
    "batch_size": 4,
    "micro_batch_size": 2,
    "hvp_batch_size": 2,
    "directions_per_pass": 4,
    "dtype": "float32",
    "amp": False,
    "tf32": True,
    "engine": "adjoint",
    "compile_hvp": True,
    "device_kind": "cuda:NVIDIA GH200 480GB",
}


def write_project(folder: Path) -> Path:
    """The run configuration and the timing entry of the analysis, written into ``folder``."""
    (folder / "run.yaml").write_text(yaml.safe_dump(RUN))
    (folder / "timing.json").write_text(json.dumps({"entries": [{"key": KEY, "seconds": SECONDS}]}))
    return folder


def plan_config(cluster=None, **analysis):
    """The workflow configuration: the run trained here, analysis ``gpu`` (with ``analysis``'s
    entries), the cluster section (with ``cluster``'s)."""
    return {
        "train_runs": {"tiny": {"config": "run.yaml", "shard_tokens": 64}},
        "analyses": {
            "gpu": {"run": "runs/tiny", "settings": {**SETTINGS, "device": "cuda", "dtype": "float32"}, **analysis}
        },
        "cluster": {"timing_profiles": ["timing.json"], **(cluster or {})},
    }
