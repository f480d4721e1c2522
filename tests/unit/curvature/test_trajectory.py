"""Curvature along the step training took, against the dense float64 oracle: ḡᵀΔ, ΔᵀHΔ, ΔᵀGΔ, the
quadratic model's best step and predicted loss, and the loss actually measured at the successor
(a forward pass), whole and per parameter block, with every exact engine, on every architecture
with second-order rules (Llama, GPT-2, GPT-NeoX). Sharded over 2 and 3 ranks the same numbers come
out: tests/unit/curvature/test_sharded_noise.py."""

import dataclasses

import pytest
import torch
from builders import make_oracle_run
from oracles import EXACT_ENGINES, FORM_ENGINES, dense_gauss_newton
from torch.func import functional_call, grad, hessian

from tiny_llm.architectures import ARCHITECTURES, build_model
from tiny_llm.curvature.blocks import parameter_blocks
from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.curvature.records import Direction
from tiny_llm.curvature.trajectory import STEP_STATISTICS, step_statistics
from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.model.causal import token_losses

CPU64 = Precision(torch.device("cpu"), torch.float64)


NATIVE = [a.name for a in ARCHITECTURES.values() if a.jets]
"""Every architecture with second-order rules, from the registry (a new one is checked here too)."""


@pytest.fixture(scope="module", params=NATIVE)
def oracle(request, tmp_path_factory):
    config = make_oracle_run(tmp_path_factory.mktemp("trajectory"), tokens=3 * 6 * 4 * 2)
    cache = TokenCache(config.data.cache)
    torch.manual_seed(2)
    shape = dataclasses.replace(config.model, architecture=request.param, tie_embeddings=request.param != "gpt_neox")
    model = build_model(shape, attention_backend="reference").double()
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])
    plan = epoch_plan(config, 1)
    tokens = torch.cat([cache.tokens(b) for b in plan.blocks])

    def loss(x):
        logits = functional_call(model, flat.unflatten(x), (tokens[:, :-1],))
        return token_losses(logits, tokens[:, 1:]).mean()

    g = grad(loss)(theta)
    delta = -0.05 * g + 0.002 * torch.randn(flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    dense = {
        "H": hessian(loss)(theta),
        "G": dense_gauss_newton(model, tokens),
        "g": g,
        "loss": float(loss(theta)),
        "loss_at": lambda d: float(loss(theta + d)),
    }
    return config, cache, model, plan, flat, delta, dense


def _inputs(cache, plan, engine, **changes):
    settings = dict(micro_batch_size=2, hvp_batch_size=4, noise_samples=2, random_samples=2, seed=11)
    return CaseInputs(
        cache=cache, plan=plan, engine=engine, directions_per_pass=3, compile=False, **settings, **changes
    )


def _close(value, expected):
    assert value == (None if expected is None else pytest.approx(expected, rel=1e-9, abs=1e-12))


def _expected(g, H, G, delta, loss, loss_at):
    curvature = float(delta @ H @ delta)
    dot = float(g @ delta)
    return {
        "step_grad_dot": dot,
        "step_curvature": curvature,
        "step_gauss_newton": None if G is None else float(delta @ G @ delta),
        "step_sharpness": curvature / float(delta @ delta),
        "step_norm": float(delta.norm()),
        "optimal_step": -dot / curvature if curvature > 0 else None,
        "predicted_loss_change": dot + 0.5 * curvature,
        "actual_loss_change": loss_at(delta) - loss,
    }


@pytest.mark.parametrize("engine", EXACT_ENGINES)
def test_the_step_to_the_successor_equals_the_dense_oracle(oracle, engine):
    config, cache, model, plan, flat, delta, dense = oracle
    inputs = _inputs(cache, plan, engine, block_curvature=True, step=delta)
    before = [p.detach().clone() for p in model.parameters()]
    result = measure_case(model, inputs, CPU64)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # θ restored exactly
    G = dense["G"] if engine in FORM_ENGINES else None
    expected = _expected(dense["g"], dense["H"], G, delta, dense["loss"], dense["loss_at"])
    for key in STEP_STATISTICS:
        _close(result["statistics"][key], expected[key])

    # the quadratic model's error is of third order in the step: about an eighth of it at half the
    # step (a quarter would be second order)
    def model_error(t):
        predicted = _expected(dense["g"], dense["H"], G, t * delta, dense["loss"], dense["loss_at"])
        return abs(predicted["predicted_loss_change"] - predicted["actual_loss_change"])

    assert 0.1 < model_error(0.5) / model_error(1.0) < 0.2
    blocks = parameter_blocks(flat.names)
    assert [row["block"] for row in result["blocks"]] == [name for name, _ in blocks]
    offsets = torch.tensor([0, *flat.sizes]).cumsum(0)
    for row, (_, indices) in zip(result["blocks"], blocks, strict=True):
        mask = torch.zeros(flat.D, dtype=torch.float64)
        for i in indices:
            mask[offsets[i] : offsets[i + 1]] = 1
        part = delta * mask
        block = _expected(dense["g"], dense["H"], G, part, dense["loss"], dense["loss_at"])
        for key in STEP_STATISTICS:
            _close(row[key], block[key])


def test_no_minimum_along_a_step_of_negative_curvature():
    found = step_statistics(-0.3, Direction(curvature=-2.0, gauss_newton=1.0, squared_norm=4.0), 0.1)
    assert found["optimal_step"] is None and found["step_sharpness"] == -0.5 and found["step_norm"] == 2.0
    assert found["predicted_loss_change"] == pytest.approx(-1.3)
    assert step_statistics(0.0, Direction(curvature=0.0, squared_norm=0.0), None)["step_sharpness"] is None


def test_without_a_successor_nothing_is_added(oracle):
    config, cache, model, plan, *_ = oracle
    inputs = _inputs(cache, plan, "adjoint")
    result = measure_case(model, inputs, CPU64)
    assert not set(STEP_STATISTICS) & set(result["statistics"])
