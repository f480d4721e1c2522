"""A cross-seed experiment on tiny float64 runs: the reference set, one record per checkpoint
(against dense computations), and the comparison of seeds (same seed twice: identical)."""

import dataclasses
import json

import pytest
import torch
from seed_runs import CHECKPOINTS, SETTINGS, seed_experiment
from torch.func import functional_call, hessian

from tiny_llm.curvature.hessian import FlatParameters
from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.geometry.comparison import compare
from tiny_llm.geometry.experiment import make_reference, measure_checkpoint
from tiny_llm.geometry.settings import GeometrySettings
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """Seeds 1 and 2, seed 1 again (same-seed control), each measured at every checkpoint."""
    return seed_experiment(tmp_path_factory.mktemp("seeds"))


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
