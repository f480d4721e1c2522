"""The Snakemake workflow on a tiny configuration: prepare a cache, train, reuse, refuse changes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")

TINY_RUN = {
    "model": {"d_model": 8, "n_heads": 2, "d_ff": 16, "n_layers": 1, "max_seq_len": 16},
    "data": {"cache": "cache/tiny", "seq_len": 16, "shuffle_group_blocks": 4},
    "training": {"batch_size": 4, "micro_batch_size": 3, "tokens": 512, "epochs": 2, "checkpoint_policy": "interval"},
}


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{SNAKEMAKE.parent}:{os.environ['PATH']}"}
    return subprocess.run([str(SNAKEMAKE), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
                           "--configfile", str(workdir / "config.yaml"), "-c1", *args],
                          capture_output=True, text=True, env=env, cwd=REPO)


def _write_config(workdir: Path, **overrides) -> None:
    (workdir / "run.yaml").write_text(yaml.safe_dump(TINY_RUN))
    entry = {"config": str(workdir / "run.yaml"), "set": overrides, "shard_tokens": 64}
    (workdir / "config.yaml").write_text(yaml.safe_dump({"train_runs": {"tiny": entry}}))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("workflow")
    _write_config(path)
    done = _snakemake(path)
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def test_workflow_prepares_and_trains(workdir):
    assert (workdir / "cache/tiny/meta.json").exists()
    run = workdir / "runs/tiny"
    assert sorted(p.name for p in run.glob("epoch-*.safetensors")) == ["epoch-000.safetensors", "epoch-001.safetensors",
                                                                     "epoch-002.safetensors"]
    assert (run / "final.pt").exists() and (workdir / "logs/train/tiny.log").read_text().count("finished") == 1
    receipt = json.loads((run / "trained.json").read_text())
    assert receipt["position"]["step"] == 8 and receipt["checkpoints"][-1] == "epoch-002.safetensors"


def test_rerun_has_nothing_to_do(workdir):
    dry = _snakemake(workdir, "-n")
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr


def test_changed_setting_does_not_destroy_a_finished_run(workdir):
    before = (workdir / "runs/tiny/final.pt").read_bytes()
    _write_config(workdir, **{"training.lr": 0.001})
    try:
        changed = _snakemake(workdir)
    finally:
        _write_config(workdir)
    assert changed.returncode != 0
    assert "other settings (training.lr: 0.003 -> 0.001)" in changed.stdout + changed.stderr
    assert (workdir / "runs/tiny/final.pt").read_bytes() == before
    restored = _snakemake(workdir)  # the original settings: the receipt is rewritten, nothing retrained
    assert restored.returncode == 0, restored.stderr[-2000:]
    assert (workdir / "runs/tiny/final.pt").read_bytes() == before


def test_unknown_config_key_is_rejected(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"train_runs": {}, "colour": "blue"}))
    result = _snakemake(tmp_path, "-n")
    assert result.returncode != 0 and "colour" in result.stdout + result.stderr
