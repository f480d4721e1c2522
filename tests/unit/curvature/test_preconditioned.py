"""The statistics in the optimizer's geometry against a dense float64 oracle: the explicit Hessian H,
P from a real AdamW state after a few steps, every preconditioned statistic and its standard error
written out from H and P, whole and per block, on every architecture with second-order rules; and
with P = I every preconditioned statistic equals its plain one."""

import dataclasses
import math

import pytest
import torch
from builders import make_oracle_run
from oracles import adam_diagonal, dense_epoch_hessian
from torch.func import functional_call, grad

from tiny_llm.architectures import ARCHITECTURES, build_model
from tiny_llm.curvature.blocks import parameter_blocks
from tiny_llm.curvature.gradients import noise_batch_indices
from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.curvature.vectors import rademacher
from tiny_llm.data.tokens import TokenCache, epoch_plan
from tiny_llm.model.causal import token_losses

CPU64 = Precision(torch.device("cpu"), torch.float64)
NATIVE = [a.name for a in ARCHITECTURES.values() if a.jets]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_oracle_run(tmp_path_factory.mktemp("preconditioned"), tokens=3 * 6 * 5 * 2)  # 5 batches


def _model(config, architecture):
    torch.manual_seed(1)
    model_config = dataclasses.replace(
        config.model, architecture=architecture, tie_embeddings=architecture != "gpt_neox"
    )
    return build_model(model_config, attention_backend="reference").double()


def _inputs(config, **kw) -> CaseInputs:
    base = dict(
        cache=TokenCache(config.data.cache),
        plan=epoch_plan(config, 1),
        micro_batch_size=config.training.micro_batch_size,
        hvp_batch_size=2,
        noise_samples=3,
        random_samples=4,
        seed=11,
        engine="taylor",
        directions_per_pass=4,
        compile=False,
    )
    return CaseInputs(**{**base, **kw})


def _close(value, expected, rel=1e-10):
    assert value == (None if expected is None else pytest.approx(expected, rel=rel, abs=rel * 1e-2))


@pytest.mark.parametrize(
    ("architecture", "engine"),
    [*((a, "taylor") for a in NATIVE), (NATIVE[0], "adjoint"), (NATIVE[0], "double_backward")],
)
def test_preconditioned_statistics_equal_the_dense_oracle(run, architecture, engine):
    model = _model(run, architecture)
    cache, plan = TokenCache(run.data.cache), epoch_plan(run, 1)
    batches = [cache.tokens(b) for b in plan.blocks]
    p = adam_diagonal(model, batches)
    flat = FlatParameters(model)
    theta = flat.flatten([q.detach() for q in model.parameters()])

    def loss(x, rows):
        return token_losses(functional_call(model, flat.unflatten(x), (rows[:, :-1],)), rows[:, 1:]).mean()

    H = dense_epoch_hessian(model, torch.cat(batches))
    g_bar = grad(lambda x: loss(x, torch.cat(batches)))(theta)
    chosen = noise_batch_indices(len(plan), 3, 11)
    g = [grad(lambda x, b=batches[i]: loss(x, b))(theta) for i in chosen]
    result = measure_case(model, _inputs(run, engine=engine, preconditioner=p, block_curvature=True), CPU64)
    got, errors = result["preconditioned"]["statistics"], result["preconditioned"]["standard_errors"]

    D, B, M = H.shape[0], 3, 15
    c = (M - 1) / (M - B)
    v = [gi - g_bar for gi in g]
    vPv = [float(x @ (p * x)) for x in v]
    PHP = [float((p * x) @ H @ (p * x)) for x in v]
    gPg, gPHPg = float(g_bar @ (p * g_bar)), float((p * g_bar) @ H @ (p * g_bar))
    r = [rademacher(D, 11, i) for i in range(4)]
    s = p.sqrt()
    expected = {
        "noise_curvature": sum(PHP) / 3,
        "normalized_alignment": sum(PHP) / sum(vPv),
        "mean_noise_norm": sum(math.sqrt(x) for x in vPv) / 3,
        "mean_grad_norm": sum(math.sqrt(float(x @ (p * x))) for x in g) / 3,
        "full_grad_norm": math.sqrt(gPg),
        "random_curvature": sum(float((s * x) @ H @ (s * x)) for x in r) / (4 * D),
        "grad_curvature": gPHPg,
        "b_simple": B * c * sum(vPv) / 3 / gPg,
        "b_noise": B * c * sum(PHP) / 3 / gPHPg if gPHPg > 0 else None,  # null where ḡᵀPHPḡ ≤ 0
        "gradient_sharpness": gPHPg / gPg,
        "gradient_step": gPg / gPHPg if gPHPg > 0 else None,
    }
    for key, value in expected.items():
        _close(got[key], value)
    fpc = 1 - 3 / 5

    def se(values):
        return math.sqrt(fpc * float(torch.tensor(values, dtype=torch.float64).var()) / len(values))

    _close(errors["b_noise_se"], B * c * se(PHP) / gPHPg if gPHPg > 0 else None)
    _close(errors["b_simple_se"], B * c * se(vPv) / gPg)
    # per block: the block-diagonal forms of Pvᵢ and Pḡ, the block's P-norms
    for row, (name, indices) in zip(result["preconditioned"]["blocks"], parameter_blocks(flat.names), strict=True):
        mask = torch.zeros(D, dtype=torch.float64)
        starts = [0, *torch.tensor(flat.sizes).cumsum(0).tolist()]
        for i in indices:
            mask[starts[i] : starts[i + 1]] = 1
        pb = p * mask
        block_PHP = [float((pb * x) @ H @ (pb * x)) for x in v]
        gb = float((pb * g_bar) @ H @ (pb * g_bar))
        assert row["block"] == name
        _close(row["grad_curvature"], gb)
        _close(row["noise_curvature"], sum(block_PHP) / 3)
        _close(row["full_grad_norm"], math.sqrt(float(g_bar @ (pb * g_bar))))
        _close(row["b_noise"], B * c * sum(block_PHP) / 3 / gb if gb > 0 else None)
    # the plain statistics are those without P
    plain = measure_case(model, _inputs(run, engine=engine, block_curvature=True), CPU64)
    assert plain["preconditioned"] is None
    for key in ("statistics", "standard_errors"):
        assert result[key].keys() == plain[key].keys()
        for name, value in plain[key].items():
            _close(result[key][name], value, 1e-12)


def test_with_p_the_identity_every_preconditioned_statistic_is_the_plain_one(run):
    model = _model(run, NATIVE[0])
    D = FlatParameters(model).D
    result = measure_case(
        model, _inputs(run, preconditioner=torch.ones(D, dtype=torch.float64), block_curvature=True), CPU64
    )
    preconditioned = result["preconditioned"]
    for key, value in result["statistics"].items():
        if key in preconditioned["statistics"]:
            _close(preconditioned["statistics"][key], value, 1e-12)
    for key, value in result["standard_errors"].items():
        _close(preconditioned["standard_errors"][key], value, 1e-12)
    for a, b in zip(preconditioned["blocks"], result["blocks"], strict=True):
        for key, value in b.items():
            if key in a and not key.startswith("step_"):
                _close(a[key], value, 1e-12) if isinstance(value, float) else None
    assert result["counts"]["hvp_passes"] > 0


def test_the_audit_replays_the_preconditioned_directions_as_the_job_builds_them(run):
    """With P the audit measures each audited direction again in the optimizer's coordinates: in
    float64 its forms are (Pv)ᵀH_sub(Pv), (P·s)ᵀH_sub(P·s) with s a Rademacher direction of u, and
    (Pḡ)ᵀH_sub(Pḡ) on the audited rows, without error; in float32, P with v̂ = 0 entries (1/ε = 1e8)
    gives each precond_ statistic its implied error beside the plain ones, and the largest of all
    is what the collection flags."""
    import copy

    from tiny_llm.results.manifest import audit_block

    model = _model(run, NATIVE[0])
    cache, plan = TokenCache(run.data.cache), epoch_plan(run, 1)
    batches = [cache.tokens(b) for b in plan.blocks]
    p, h = adam_diagonal(model, batches), 2
    inputs = _inputs(run, preconditioner=p, audit=(2, 2), hvp_batch_size=h)
    audit = measure_case(model, inputs, CPU64)["audit"]
    assert audit["geometries"] == ["plain", "preconditioned"]
    kinds = ["noise", "noise", "random", "random", "gradient"]
    assert [d["kind"] for d in audit["directions"]] == kinds * 2
    tokens = torch.cat(batches)
    rows = torch.cat([tokens[j * h : (j + 1) * h] for j in audit["micro_batches"]])
    H_sub = dense_epoch_hessian(model, rows)
    flat = FlatParameters(model)
    theta = flat.flatten([q.detach() for q in model.parameters()])

    def loss(x, rows):
        return token_losses(functional_call(model, flat.unflatten(x), (rows[:, :-1],)), rows[:, 1:]).mean()

    g_bar = grad(lambda x: loss(x, tokens))(theta)
    for d in audit["directions"][5:]:
        assert d["geometry"] == "preconditioned"
        v = {
            "noise": lambda d=d: grad(lambda x: loss(x, batches[d["batch_index"]]))(theta) - g_bar,
            "random": lambda d=d: rademacher(flat.D, 11, d["index"]) / p.sqrt(),  # u's ±1, as θ's vector
            "gradient": lambda: g_bar,
        }[d["kind"]]()
        _close(d["float64"], float((p * v) @ H_sub @ (p * v)))
        assert d["relative_error"] < 1e-10
    errors = audit["statistics_relative_error"]
    assert {"precond_b_noise", "precond_random_curvature", "b_noise", "loss"} <= set(errors)
    assert "precond_loss" not in errors and max(v for v in errors.values() if v is not None) < 1e-9
    # float32, P with v̂ = 0 entries: the same directions, their errors implied and flagged
    p_zero = p.clone()
    p_zero[: len(p) // 4] = 1e8
    cpu32 = Precision(torch.device("cpu"), torch.float32)
    inputs = _inputs(run, preconditioner=p_zero, audit=(2, 2), hvp_batch_size=h)
    audit = measure_case(copy.deepcopy(model).float(), inputs, cpu32)["audit"]
    preconditioned = [d for d in audit["directions"] if d.get("geometry") == "preconditioned"]
    assert len(preconditioned) == 5 and all(d["relative_error"] > 0 for d in preconditioned)
    worst = max((v, k) for k, v in audit["statistics_relative_error"].items() if v is not None)
    assert audit["max_statistic_relative_error"] == worst[0]
    row = {"audit_statistic_error": worst[0], "audit_max_relative_error": audit["max_relative_error"]}
    row |= {"file": "epoch-001", "case": "seen", "state_key": "s"}
    block = audit_block([row], {("s", "seen"): {"audit": audit}}, "mine", worst[0] / 2)
    assert worst[1] in block["exceeded"][0]["statistics"]
    precond = {k: v for k, v in audit["statistics_relative_error"].items() if k.startswith("precond_")}
    assert precond and all(v is None or v > 0 for v in precond.values())
