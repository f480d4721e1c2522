"""The optimizer's preconditioner found per state: Adam's from the moments kept beside an epoch
checkpoint or held in final.pt (the same P), none at step 0 or for a packed run (blank with the
reason, or refused by name when asked for), moments of another step refused; and an SGD run, whose
geometry is the plain one (P = I), measured end to end: every preconditioned statistic its plain one."""

import json
import shutil

import pytest
import torch
from builders import make_oracle_run

from tiny_llm.model.moments import load_moments, preconditioner
from tiny_llm.training.loop import train
from tiny_llm.workers.loading import load_state
from tiny_llm.workers.preconditioning import load_preconditioning
from tiny_llm.workers.settings import AnalysisSettings
from tiny_llm.workers.state import analyze_state

FAST = AnalysisSettings(noise_samples=2, random_samples=3, device="cpu", dtype="float64", directions_per_pass=3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An AdamW run, an SGD run and a packed run of the oracle model, trained once."""
    made = {}
    for name, training in (
        ("adamw", {}),
        ("sgd", {"optimizer": "sgd", "lr": 0.05}),
        ("packed", {"tokens": 3 * 6 * 4 * 2, "packed": {"workers": 2, "sync_every": 3}}),
    ):
        path = tmp_path_factory.mktemp(name)
        config = make_oracle_run(path, **training)
        train(config, path / "run")
        made[name] = config, path / "run"
    return made


def _found(config, run, file, asked="auto"):
    state = load_state(run, [run / file], config, False)
    return load_preconditioning(run, state, config, asked)


def test_adams_p_from_the_kept_moments_and_from_final_pt_and_none_at_step_0(runs, tmp_path):
    config, run = runs["adamw"]
    kept = _found(config, run, "epoch-002.safetensors")
    final = _found(config, run, "final.pt")
    expected = preconditioner(load_moments(run / "moments-002.safetensors"))
    assert kept.diagonal.keys() == expected.keys() == final.diagonal.keys()
    assert all(
        torch.equal(kept.diagonal[n], expected[n]) and torch.equal(final.diagonal[n], expected[n]) for n in expected
    )
    assert kept.record["optimizer"] == "adamw" and kept.record["step"] == config.total_batches
    logged = [json.loads(line) for line in (run / "train-log.jsonl").read_text().splitlines()]
    assert kept.record["lr"] == logged[-1]["lr"]  # the rate the last step applied
    first = _found(config, run, "epoch-000.safetensors")
    assert first.diagonal is None and "step 0" in first.record["reason"]  # never P = I
    with pytest.raises(ValueError, match="preconditioned: true, but run/epoch-000.safetensors: at step 0"):
        _found(config, run, "epoch-000.safetensors", True)
    assert _found(config, run, "epoch-001.safetensors", False) is None
    other = tmp_path / "run"
    shutil.copytree(run, other)
    shutil.copy(other / "moments-001.safetensors", other / "moments-002.safetensors")  # another step's moments
    with pytest.raises(
        ValueError, match="the optimizer state is at step 3, the checkpoint epoch-002.safetensors at step 6"
    ):
        _found(config, other, "epoch-002.safetensors")
    (other / "moments-001.safetensors").unlink()
    missing = _found(config, other, "epoch-001.safetensors")
    assert missing.diagonal is None and "keep_moments" in missing.record["reason"]


def test_a_packed_run_has_none_and_an_sgd_run_is_its_own_plain_geometry(runs, tmp_path):
    config, run = runs["packed"]
    packed = _found(config, run, "epoch-001.safetensors")
    assert packed.diagonal is None and "packed" in packed.record["reason"]
    config, run = runs["sgd"]
    sgd = _found(config, run, "epoch-001.safetensors")
    assert sgd.record["optimizer"] == "sgd" and all(bool((p == 1).all()) for p in sgd.diagonal.values())
    assert sgd.record["stability_threshold"] == pytest.approx(2 * 1.9 / sgd.record["lr"])
    result = analyze_state(run, ["epoch-001.safetensors"], "seen", FAST, tmp_path / "seen.json")
    plain, preconditioned = result, result["preconditioned"]
    for key in ("statistics", "standard_errors"):
        for name, value in preconditioned[key].items():
            assert value == (None if plain[key][name] is None else pytest.approx(plain[key][name], rel=1e-12))
    assert result["preconditioner"]["optimizer"] == "sgd"
