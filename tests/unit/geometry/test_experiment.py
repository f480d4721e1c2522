"""A cross-seed experiment on tiny float64 runs: the reference set, one record per checkpoint
(against dense computations), and the comparison of seeds (same seed twice: identical)."""

import dataclasses
import json
import os
import stat

import pytest
import torch
from builders import make_oracle_run
from torch.func import functional_call, hessian

from tiny_llm.curvature.hessian import FlatParameters
from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.geometry.comparison import compare, write_comparison
from tiny_llm.geometry.experiment import make_reference, measure_checkpoint
from tiny_llm.geometry.settings import GeometrySettings
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama
from tiny_llm.training.loop import train

SETTINGS = GeometrySettings(
    reference_rows=3,
    cov_num_batches=3,
    cov_batch_size=2,
    top_k=2,
    hutchinson_samples=4,
    lanczos_steps=60,
    hvp_batch_size=2,
)
CHECKPOINTS = ["epoch-000.safetensors", "epoch-001.safetensors", "epoch-002.safetensors"]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """Seeds 1 and 2, seed 1 again (same-seed control), each measured at every checkpoint."""
    path = tmp_path_factory.mktemp("seeds")
    runs = {"s1": 1, "s2": 2, "s1-again": 1}
    configs = {label: make_oracle_run(path, seed=seed) for label, seed in runs.items()}
    for label, config in configs.items():
        train(config, path / label)
    reference = make_reference(configs["s1"], SETTINGS)
    records = {
        label: [
            measure_checkpoint(
                path / label, name, i, reference, SETTINGS, path / "records" / label / f"{name.split('.')[0]}.json"
            )
            for i, name in enumerate(CHECKPOINTS)
        ]
        for label in runs
    }
    return path, configs, reference, records


def test_the_reference_set_is_held_out_and_recorded_by_position(experiment):
    path, configs, reference, _ = experiment
    config = configs["s1"]
    trained = {int(b) for epoch in (1, 2) for b in epoch_plan(config, epoch).blocks.reshape(-1)}
    used = reference["rows"] + [b for batch in reference["cov_batches"] for b in batch]
    assert len(used) == len(set(used)) == 9 and not set(used) & trained
    cache = TokenCache(config.data.cache)
    assert reference["positions"] == [list(cache.position(b)) for b in reference["rows"]]
    assert [len(b) for b in reference["cov_batches"]] == [2, 2, 2]


def test_a_record_against_dense_computations(experiment):
    path, configs, reference, records = experiment
    config, record = configs["s2"], records["s2"][2]
    model = Llama(config.model, attention_backend="reference").double()
    from tiny_llm.model.checkpoint import load_weights

    model.load_state_dict(load_weights(path / "s2" / CHECKPOINTS[2])[0])
    rows = TokenCache(reference["cache"]).tokens(reference["rows"])
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])

    def loss(t):
        return token_losses(functional_call(model, flat.unflatten(t), (rows[:, :-1],)), rows[:, 1:]).mean()

    H = hessian(loss)(theta)
    assert record["metrics"]["eval_loss"] == pytest.approx(float(loss(theta)), rel=1e-12)
    assert record["metrics"]["hessian_top1_eigenvalue"] == pytest.approx(float(torch.linalg.eigvalsh(H)[-1]), rel=1e-8)
    lanczos = record["lanczos"]
    assert lanczos["converged"] and lanczos["tolerance"] == 1e-6 and lanczos["matvecs"] <= 61  # stopped once converged
    assert record["step"] == 6 and record["init_seed"] == 2
    assert abs(record["metrics"]["hessian_trace"] - float(H.trace())) < 5 * record["standard_errors"]["hessian_trace"]
    logged = [json.loads(line)["loss"] for line in (path / "s2/train-log.jsonl").read_text().splitlines()]
    assert record["metrics"]["train_loss"] == pytest.approx(sum(logged[3:6]) / 3)
    assert records["s2"][0]["metrics"]["train_loss"] is None  # initialisation: nothing trained yet
    assert 0 < record["metrics"]["cov_top_k_share"] <= 1 and 1 <= record["metrics"]["cov_effective_rank"] <= 2 + 1e-9


def test_an_unconverged_top_eigenvalue_is_flagged(experiment, tmp_path, caplog):
    path, configs, reference, records = experiment
    capped = dataclasses.replace(SETTINGS, lanczos_steps=2)
    record = measure_checkpoint(path / "s2", CHECKPOINTS[2], 2, reference, capped, tmp_path / "capped.json")
    assert record["lanczos"]["converged"] is False and record["lanczos"]["residual"] > 1e-6
    assert "did not converge in 2 Lanczos steps" in caplog.text
    caplog.clear()
    compare({"s2": [tmp_path / "capped.json"]}, {})
    assert "did not converge at 1 checkpoints (s2 step 6)" in caplog.text


def test_seeds_compared_at_matched_steps_with_controls(experiment, tmp_path):
    path, _, _, _ = experiment
    files = {label: sorted((path / "records" / label).glob("*.json")) for label in ("s1", "s2", "s1-again")}
    rows = compare(files, {"s1-again": "same-seed"})
    value = {(r["step"], r["subject"], r["metric"]): r for r in rows}
    for step in (0, 3, 6):
        twin = value[(step, "s1|s1-again", "gradient_cosine")]
        assert twin["value"] == pytest.approx(1.0, abs=1e-12) and twin["role"] == "same-seed"
        for metric in ("parameter_subspace_overlap", "function_subspace_overlap"):
            assert value[(step, "s1|s1-again", metric)]["value"] == pytest.approx(1.0, abs=1e-12)
        assert value[(step, "s1|s2", "gradient_cosine")]["value"] < 1 - 1e-6
        assert value[(step, "s1|s2", "gradient_cosine")]["role"] == "seed"
        assert value[(step, "s1-again|s2", "gradient_cosine")]["role"] == "other"  # not what the control varies
    assert value[(0, "s1|s2", "function_update_cosine")]["value"] is None  # no earlier checkpoint
    assert value[(3, "s1|s1-again", "function_update_cosine")]["value"] == pytest.approx(1.0, abs=1e-12)
    overlap = value[(6, "s1|s2", "parameter_subspace_overlap")]
    D = json.loads(files["s1"][0].read_text())["dimensions"]["parameters_D"]
    assert overlap["baseline"] == pytest.approx(2 / D) and overlap["kind"] == "pair"
    assert value[(6, "s2", "eval_loss")]["kind"] == "run"
    pairs = [value[(6, subject, "gradient_cosine")]["value"] for subject in ("s1|s2",)]
    assert value[(6, "seed pairs (mean)", "gradient_cosine")]["value"] == pytest.approx(sum(pairs) / len(pairs))
    assert value[(6, "seed pairs (min)", "gradient_cosine")]["kind"] == "summary"
    write_comparison(rows, tmp_path / "comparison.csv")
    assert (tmp_path / "comparison.csv").read_text().splitlines()[
        0
    ] == "step,tokens,subject,kind,role,metric,value,se,baseline"


def test_changed_vectors_are_refused(experiment, tmp_path):
    path, _, _, _ = experiment
    record = path / "records/s2/epoch-001.json"
    umask = os.umask(0)
    os.umask(umask)
    for written in (record, record.with_suffix(".safetensors")):  # readable by the group, as the umask says
        assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~umask, written
    copy = tmp_path / "epoch-001.json"
    copy.write_text(record.read_text())
    (tmp_path / "epoch-001.safetensors").write_bytes(b"not the vectors")
    with pytest.raises(ValueError, match="does not match"):
        compare({"s2": [copy]}, {})


def test_a_reference_set_larger_than_the_stream_is_refused(experiment):
    _, configs, _, _ = experiment
    with pytest.raises(ValueError, match="needs 30 sequences .* holds 9"):
        make_reference(configs["s1"], GeometrySettings(reference_rows=24, cov_num_batches=3, cov_batch_size=2))


@pytest.mark.llc
def test_the_llc_in_a_record(experiment, tmp_path):
    pytest.importorskip("devinterp")
    path, _, reference, _ = experiment
    settings = GeometrySettings(
        **{
            **SETTINGS.__dict__,
            "llc_every": 1,
            "llc_chains": 2,
            "llc_draws": 20,
            "hessian_proxy_every": 0,
            "hessian_eig_every": 0,
        }
    )
    record = measure_checkpoint(path / "s1", CHECKPOINTS[2], 2, reference, settings, tmp_path / "r.json")
    assert "llc" in record["metrics"] and record["standard_errors"]["llc"] >= 0
    assert "hessian_trace" not in record["metrics"]
