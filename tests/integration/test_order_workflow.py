"""A published suite on its own training order through the workflow: revisions in a local Hugging
Face cache, the order as a Megatron indexed dataset, an analysis with seen, unseen and recent;
the workflow imports, checks, measures, collects and draws, each case on its window of training
steps, and a rerun does nothing."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_hub import RUN_YAML, ordered_suite

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def _snakemake(workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(workdir / "hf"), "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    command = [str(SNAKEMAKE), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--configfile", str(workdir / "config.yaml"), "-c2", *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def test_a_suite_on_its_training_order_through_the_workflow(tmp_path):
    ordered_suite(tmp_path, per_step=2, steps=10, saved=(2, 4, 6))
    (tmp_path / "run.yaml").write_text(RUN_YAML.replace("cache/p", "cache/ordered"))
    (tmp_path / "a.txt").write_text("a reference text the offset case would read " * 300)
    settings = {"device": "cpu", "dtype": "float64", "noise_samples": 2, "random_samples": 2, "directions_per_pass": 2}
    analysis = {
        "config": "run.yaml",
        "hf_checkpoints": {"repo": "org/ordered", "revisions": "all"},
        "tokens_per_step": 16,
        "cache_inputs": ["a.txt"],
        "training_order": {"path": "document", "format": "megatron", "sequences_per_step": 2},
        "case_steps": 2,
        "cases": ["seen", "unseen", "recent"],
        "settings": settings,
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"analyses": {"ordered": analysis}, "plots": {}}))
    done = _snakemake(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "results/ordered/summary.csv").open()))
    assert [(r["source"], r["case"]) for r in rows] == [
        (f"step{s}", c) for s in (2, 4, 6) for c in ("seen", "unseen", "recent")
    ]
    loss = {(r["source"], r["case"]): float(r["loss"]) for r in rows}
    assert loss["step2", "seen"] == loss["step2", "recent"]  # at the earliest checkpoint both are steps 1..2
    assert loss["step6", "recent"] < loss["step6", "seen"] < loss["step6", "unseen"]  # last trained, long ago, never
    manifest = json.loads((tmp_path / "results/ordered/manifest.json").read_text())
    assert manifest["data"]["seen"]["window"] == {"first_step": 1, "last_step": 2, "steps": 2}
    assert manifest["data"]["unseen"]["window"] == {"first_step": 7, "last_step": 8, "steps": 2}
    assert manifest["integrity"]["checked"] == 3 and manifest["integrity"]["flagged"] == []
    assert all(r["integrity"] == "" for r in rows)
    again = _snakemake(tmp_path, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
