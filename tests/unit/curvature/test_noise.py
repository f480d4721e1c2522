"""Noise statistics against a brute-force oracle: explicit Hessian, explicitly enumerated batches."""

import math

import pytest
import torch
from builders import make_oracle_run
from oracles import FORM_ENGINES, dense_gauss_newton
from torch.func import functional_call, grad, hessian

from tiny_llm.curvature.blocks import parameter_blocks
from tiny_llm.curvature.gradients import mean_gradient, noise_batch_indices
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision
from tiny_llm.curvature.noise import CaseInputs, measure_case
from tiny_llm.curvature.records import NoiseSample, RandomDirection
from tiny_llm.curvature.statistics import (
    STANDARD_ERRORS,
    Samples,
    standard_errors,
    summarise,
)
from tiny_llm.curvature.vectors import rademacher
from tiny_llm.data.tokens import TokenCache, epoch_plan, unseen_plan
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama

CPU64 = Precision(torch.device("cpu"), torch.float64)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    path = tmp_path_factory.mktemp("oracle")
    config = make_oracle_run(path, tokens=3 * 6 * 5 * 2)  # 5 batches per epoch
    cache = TokenCache(config.data.cache)
    torch.manual_seed(1)
    model = Llama(config.model, attention_backend="reference").double()
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])
    plan = epoch_plan(config, 1)
    batches = [cache.tokens(b) for b in plan.blocks]

    def loss(x, rows):
        logits = functional_call(model, flat.unflatten(x), (rows[:, :-1],))
        return token_losses(logits, rows[:, 1:]).mean()

    everything = torch.cat(batches)
    H = hessian(lambda x: loss(x, everything))(theta)
    g_bar = grad(lambda x: loss(x, everything))(theta)
    g = [grad(lambda x, b=b: loss(x, b))(theta) for b in batches]
    return config, cache, model, plan, H, g_bar, g


def _inputs(config, cache, plan, **kw):
    base = dict(
        cache=cache,
        plan=plan,
        micro_batch_size=config.training.micro_batch_size,
        hvp_batch_size=4,
        noise_samples=None,
        random_samples=6,
        seed=11,
        engine="double_backward",
        directions_per_pass=4,
        compile=False,
    )
    return CaseInputs(**{**base, **kw})


def _assert_close(value, expected):
    assert value == (None if expected is None else pytest.approx(expected, rel=1e-9, abs=1e-10))


def test_statistics_equal_the_dense_oracle(oracle):
    config, cache, model, plan, H, g_bar, g = oracle
    e = [
        torch.randn(H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 1e-2,
        torch.zeros(H.shape[0], dtype=torch.float64),
    ]
    result = measure_case(model, _inputs(config, cache, plan, noise_samples=3, consensus=list(enumerate(e))), CPU64)
    chosen = noise_batch_indices(len(plan), 3, 11)
    assert [r["batch_index"] for r in result["noise_samples"]] == chosen and len(set(chosen)) == 3
    v = [g[i] - g_bar for i in chosen]
    s = [rademacher(H.shape[0], 11, i) for i in range(6)]
    vHv, vv = [x @ H @ x for x in v], [x @ x for x in v]

    def direct_loss(rows):  # token-mean cross-entropy, straight from the model
        with torch.no_grad():
            return float(token_losses(model(rows[:, :-1]), rows[:, 1:]).mean())

    batches = [cache.tokens(b) for b in plan.blocks]
    for record, i, q, n2 in zip(result["noise_samples"], chosen, vHv, vv, strict=True):
        _assert_close(record["loss"], direct_loss(batches[i]))
        _assert_close(record["grad_norm"], float(g[i].norm()))
        _assert_close(record["noise_norm"], math.sqrt(n2))
        _assert_close(record["noise_curvature"], float(q))
        assert record["positions"] == plan.positions(cache, i)
    for record, x in zip(result["random_directions"], s, strict=True):
        _assert_close(record["curvature"], float(x @ H @ x))
    D, B, M = H.shape[0], 3, 15
    c = (M - 1) / (M - B)
    gHg = float(g_bar @ H @ g_bar)
    expected = {
        "noise_curvature": float(sum(vHv)) / 3,
        "normalized_alignment": float(sum(vHv) / sum(vv)),
        "mean_noise_norm": sum(math.sqrt(x) for x in vv) / 3,
        "mean_grad_norm": sum(float(g[i].norm()) for i in chosen) / 3,
        "full_grad_norm": float(g_bar.norm()),
        "random_curvature": float(sum(x @ H @ x for x in s)) / (D * 6),
        "grad_curvature": gHg,
        "b_simple": B * c * float(sum(vv)) / 3 / float(g_bar @ g_bar),
        "b_noise": B * c * float(sum(vHv)) / 3 / gHg if gHg > 0 else None,  # null when ḡᵀHḡ ≤ 0
        "gradient_sharpness": gHg / float(g_bar @ g_bar),
        "gradient_step": float(g_bar @ g_bar) / gHg if gHg > 0 else None,
        "loss": direct_loss(torch.cat(batches)),  # the epoch loss of the case
        # Gauss–Newton parts: the HVP engines have none.
        "noise_gauss_newton": None,
        "random_gauss_newton": None,
        "grad_gauss_newton": None,
    }
    assert set(result["statistics"]) == set(expected)
    for key, value in expected.items():
        _assert_close(result["statistics"][key], value)
    # Standard errors, written out independently: sample std (ddof 1), finite population of 5 batches.
    fpc = 1 - 3 / 5

    def se(values, factor=fpc):
        return math.sqrt(factor * float(torch.tensor(values, dtype=torch.float64).var()) / len(values))

    R = float(sum(vHv) / sum(vv))
    expected_se = {
        "noise_curvature_se": se([float(q) for q in vHv]),
        "mean_noise_norm_se": se([math.sqrt(x) for x in vv]),
        "mean_grad_norm_se": se([float(g[i].norm()) for i in chosen]),
        "random_curvature_se": se([float(x @ H @ x) for x in s], 1.0) / D,
        "b_simple_se": B * c * se([float(x) for x in vv]) / float(g_bar @ g_bar),
        "b_noise_se": B * c * se([float(q) for q in vHv]) / gHg if gHg > 0 else None,
        "normalized_alignment_se": math.sqrt(
            fpc * sum(float(q - R * x) ** 2 for q, x in zip(vHv, vv, strict=True)) / 2 / 3
        )
        / (float(sum(vv)) / 3),
        "noise_gauss_newton_se": None,
        "random_gauss_newton_se": None,  # HVP engines: no split
    }
    assert set(result["standard_errors"]) == {f"{k}_se" for k in STANDARD_ERRORS} == set(expected_se)
    for key, value in expected_se.items():
        _assert_close(result["standard_errors"][key], value)
    workers = result["consensus"]["workers"]
    _assert_close(workers[0]["curvature"], float(e[0] @ H @ e[0]))
    _assert_close(workers[0]["squared_norm"], float(e[0] @ e[0]))
    _assert_close(workers[0]["normalized_alignment"], float(e[0] @ H @ e[0] / (e[0] @ e[0])))
    assert workers[1] | {"total_seconds": 0} == {
        "worker": 1,
        "curvature": 0.0,
        "hvp_seconds": 0.0,
        "total_seconds": 0,
        "squared_norm": 0.0,
        "norm": 0.0,
        "normalized_alignment": None,
    }
    aggregate = result["consensus"]["aggregate"]
    _assert_close(aggregate["mean_curvature"], float(e[0] @ H @ e[0]) / 2)
    _assert_close(aggregate["normalized_alignment"], float(e[0] @ H @ e[0] / (e[0] @ e[0])))
    _assert_close(aggregate["mean_norm"], float(e[0].norm()) / 2)
    counts = result["counts"]
    assert (counts["parameters_D"], counts["epoch_batches"], counts["epoch_tokens"], counts["noise_samples"]) == (
        D,
        5,
        90,
        3,
    )
    assert counts["hvp_passes"] == math.ceil((3 + 6 + 1 + 1) / 4)  # the zero consensus direction skips its pass


def test_engines_and_batching_give_the_same_statistics(oracle):
    config, cache, model, plan, *_ = oracle
    runs = [
        measure_case(model, _inputs(config, cache, plan, engine=engine, directions_per_pass=K, hvp_batch_size=h), CPU64)
        for engine, K, h in [
            ("double_backward", 1, 3),
            ("double_backward", 5, 15),
            ("pearlmutter", 1, 2),
            ("pearlmutter", 4, 4),
            ("taylor", 1, 3),
            ("taylor", 6, 7),
            ("adjoint", 1, 2),
            ("adjoint", 16, 4),
        ]
    ]
    for other in runs[1:]:
        for key, value in runs[0]["statistics"].items():
            if "gauss_newton" not in key:
                _assert_close(other["statistics"][key], value)
    for other in runs[5:]:  # the form engines: the same Gauss–Newton parts
        for key in ("noise_gauss_newton", "random_gauss_newton", "grad_gauss_newton"):
            _assert_close(other["statistics"][key], runs[4]["statistics"][key])


@pytest.mark.parametrize("engine", FORM_ENGINES)
def test_gauss_newton_statistics_equal_the_dense_oracle(oracle, engine):
    """noise, random and ḡ Gauss–Newton parts against vᵀJᵀ∇²ℓJv with the dense Jacobian; each is
    ≥ 0, and each statistic minus its part is the residual's share."""
    config, cache, model, plan, H, g_bar, g = oracle
    G = dense_gauss_newton(model, torch.cat([cache.tokens(b) for b in plan.blocks]))
    result = measure_case(model, _inputs(config, cache, plan, noise_samples=3, engine=engine), CPU64)
    chosen = noise_batch_indices(len(plan), 3, 11)
    v = [g[i] - g_bar for i in chosen]
    s = [rademacher(H.shape[0], 11, i) for i in range(6)]
    for record, x in zip(result["noise_samples"], v, strict=True):
        _assert_close(record["noise_gauss_newton"], float(x @ G @ x))
        _assert_close(record["noise_curvature"], float(x @ H @ x))
    for record, x in zip(result["random_directions"], s, strict=True):
        _assert_close(record["gauss_newton"], float(x @ G @ x))
    statistics = result["statistics"]
    _assert_close(statistics["noise_gauss_newton"], float(sum(x @ G @ x for x in v)) / 3)
    _assert_close(statistics["random_gauss_newton"], float(sum(x @ G @ x for x in s)) / (6 * H.shape[0]))
    _assert_close(statistics["grad_gauss_newton"], float(g_bar @ G @ g_bar))
    assert all(statistics[k] >= 0 for k in ("noise_gauss_newton", "random_gauss_newton", "grad_gauss_newton"))
    errors = result["standard_errors"]
    expected_se = standard_errors(
        _samples(
            result["noise_samples"],
            result["random_directions"],
            float(g_bar.norm()),
            statistics["grad_curvature"],
            H.shape[0],
            3,
            15,
        )
    )
    _assert_close(errors["noise_gauss_newton_se"], expected_se["noise_gauss_newton_se"])
    assert errors["noise_gauss_newton_se"] > 0 and errors["random_gauss_newton_se"] > 0


def test_a_forms_engine_without_a_gauss_newton_part_leaves_those_statistics_blank(oracle, monkeypatch):
    """The registry decides: a forms engine that does not declare a Gauss–Newton part reports its
    forms (equal to the exact engines') and blank Gauss–Newton statistics, never 0."""
    from tiny_llm.curvature.engines import ENGINES, Engine

    config, cache, model, plan, *_ = oracle
    monkeypatch.setitem(ENGINES, "forms_only", Engine("forms_only", "forms", "test", "tiny_llm.curvature.forms:taylor",
                                                      jets=True, rows_per_direction=True))  # fmt: skip
    inputs = dict(noise_samples=3, random_samples=2)
    plain = measure_case(model, _inputs(config, cache, plan, engine="forms_only", **inputs), CPU64)["statistics"]
    exact = measure_case(model, _inputs(config, cache, plan, engine="taylor", **inputs), CPU64)["statistics"]
    for key in ("noise_gauss_newton", "random_gauss_newton", "grad_gauss_newton"):
        assert plain[key] is None and exact[key] is not None
    _assert_close(plain["noise_curvature"], exact["noise_curvature"])


def test_all_noise_samples_and_cap(oracle):
    config, cache, model, plan, *_ = oracle
    capped = measure_case(model, _inputs(config, cache, plan, noise_samples=99, random_samples=0), CPU64)
    assert sorted(r["batch_index"] for r in capped["noise_samples"]) == list(range(5))
    assert capped["statistics"]["random_curvature"] is None
    assert noise_batch_indices(5, 2, 11) == noise_batch_indices(5, 2, 11) != noise_batch_indices(5, 2, 12)


def test_zero_noise_gives_null_alignment(oracle):
    config, cache, model, plan, *_ = oracle
    one_batch = plan.__class__("one", plan.blocks[:1], plan.stream_batches[:1])
    result = measure_case(model, _inputs(config, cache, one_batch, random_samples=1), CPU64)
    stats = result["statistics"]
    assert result["noise_samples"][0]["noise_norm"] == 0.0
    assert stats["normalized_alignment"] is None and stats["b_simple"] is None and stats["b_noise"] is None
    assert stats["noise_curvature"] == 0.0


def test_random_curvature_converges_to_trace_over_D(oracle):
    """Hutchinson: E[sᵀHs] = tr(H), Var = 2(‖H‖_F² − Σ H_ii²). With S_r = 600 the estimate of
    tr(H)/D lies within 4 standard errors (a fixed seed, so the check is deterministic)."""
    config, cache, model, plan, H, *_ = oracle
    D = H.shape[0]
    op = EpochHessian(
        model,
        torch.cat([cache.tokens(b) for b in plan.blocks]),
        batch_size=15,
        engine="double_backward",
        precision=CPU64,
        directions_per_pass=100,
    )
    forms = op.quadratic_forms(torch.stack([rademacher(D, 11, i) for i in range(600)]))
    sd = math.sqrt(2 * (float((H**2).sum()) - float((H.diagonal() ** 2).sum())))
    target = float(H.trace()) / D
    for S_r in (50, 600):
        error = abs(float(forms[:S_r].mean()) / D - target)
        assert error < 4 * sd / math.sqrt(S_r) / D
    assert abs(float(forms.mean()) / D - target) < abs(float(forms[:5].mean()) / D - target) + 1e-12


def test_standard_errors_match_the_sampling_distribution(oracle):
    """The noise standard errors are exact for drawing S_v of the epoch's n batches without
    replacement: averaged over every possible draw, se² equals the variance of the estimate over
    those draws (and with S_v = n there is nothing left to sample). The random-direction standard
    error matches the Hutchinson standard deviation, 2(‖H‖_F² − Σ H_ii²), within 10 % at S_r = 400."""
    import itertools

    config, cache, model, plan, H, g_bar, g = oracle
    D, B, n = H.shape[0], 3, len(plan)
    records = [
        {
            "noise_curvature": float((g[i] - g_bar) @ H @ (g[i] - g_bar)),
            "noise_norm": float((g[i] - g_bar).norm()),
            "grad_norm": float(g[i].norm()),
        }
        for i in range(n)
    ]
    gHg = float(g_bar @ H @ g_bar)
    for S in (2, 3, 4):
        draws = [[records[i] for i in chosen] for chosen in itertools.combinations(range(n), S)]
        for name in ("noise_curvature", "mean_noise_norm", "mean_grad_norm", "b_simple"):
            estimates = [summarise(_samples(d, [], float(g_bar.norm()), gHg, D, B, n * B))[name] for d in draws]
            variance = float(torch.tensor(estimates, dtype=torch.float64).var(unbiased=False))
            mean_se2 = sum(
                standard_errors(_samples(d, [], float(g_bar.norm()), gHg, D, B, n * B))[f"{name}_se"] ** 2
                for d in draws
            ) / len(draws)
            assert mean_se2 == pytest.approx(variance, rel=1e-9)
    everything = standard_errors(_samples(records, [], float(g_bar.norm()), gHg, D, B, n * B))
    assert everything["noise_curvature_se"] == everything["normalized_alignment_se"] == 0.0
    op = EpochHessian(
        model,
        torch.cat([cache.tokens(b) for b in plan.blocks]),
        batch_size=15,
        engine="double_backward",
        precision=CPU64,
        directions_per_pass=100,
    )
    forms = op.quadratic_forms(torch.stack([rademacher(D, 5, i) for i in range(400)]))
    random = [{"curvature": float(q)} for q in forms]
    sd = math.sqrt(2 * (float((H**2).sum()) - float((H.diagonal() ** 2).sum())))
    se = standard_errors(_samples(records[:1], random, float(g_bar.norm()), gHg, D, B, n * B))
    assert se["random_curvature_se"] == pytest.approx(sd / math.sqrt(400) / D, rel=0.1)
    assert se["noise_curvature_se"] is None  # one noise sample: no spread to estimate


def test_unseen_plan_is_used_for_unseen(oracle):
    config, cache, model, *_ = oracle
    plan = unseen_plan(config)
    result = measure_case(model, _inputs(config, cache, plan, noise_samples=1, random_samples=0), CPU64)
    i = result["noise_samples"][0]["batch_index"]
    assert result["noise_samples"][0]["positions"] == plan.positions(cache, i)


def _samples(noise: list[dict], random: list[dict], *exact) -> Samples:
    """Samples from plain records (as a result saves them, or only the keys a statistic reads)."""
    return Samples(
        [NoiseSample.from_json(r) for r in noise],
        [RandomDirection(curvature=r["curvature"], gauss_newton=r.get("gauss_newton")) for r in random],
        *exact,
    )


def test_batch_size_formulas_and_nulls():
    noise = [
        {"noise_curvature": 2.0, "noise_norm": 1.0, "grad_norm": 3.0},
        {"noise_curvature": 4.0, "noise_norm": 3.0, "grad_norm": 5.0},
    ]
    stats = summarise(_samples(noise, [{"curvature": 8.0}], 2.0, 0.5, 4, 4, 16))
    c = 15 / 12
    assert stats["b_simple"] == pytest.approx(4 * c * 5.0 / 4.0)
    assert stats["b_noise"] == pytest.approx(4 * c * 3.0 / 0.5)
    assert stats["normalized_alignment"] == pytest.approx(6 / 10) and stats["random_curvature"] == 2.0
    flat = summarise(_samples(noise, [], 0.0, -1.0, 4, 4, 16))
    assert flat["b_simple"] is None and flat["b_noise"] is None and flat["random_curvature"] is None


def _subset_hessian(model, rows):
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])

    def loss(x):
        logits = functional_call(model, flat.unflatten(x), (rows[:, :-1],))
        return token_losses(logits, rows[:, 1:]).mean()

    return hessian(loss)(theta)


def test_precision_audit_against_the_dense_oracle(oracle):
    """The audit's float64 values are the dense Hessian's forms on the audited micro-batches; its
    production values are a separate run in the analysis's precision on the same rows."""
    import copy

    config, cache, model, plan, H, g_bar, g = oracle
    h = 4
    tokens = torch.cat([cache.tokens(b) for b in plan.blocks])
    # float64: the audit finds no error, and its directions are the dense oracle's
    result = measure_case(model, _inputs(config, cache, plan, noise_samples=3, hvp_batch_size=h, audit=(2, 2)), CPU64)
    audit = result["audit"]
    assert [d["kind"] for d in audit["directions"]] == ["noise", "noise", "random", "random", "gradient"]
    assert len(audit["micro_batches"]) == 2 and len(set(audit["micro_batches"])) == 2
    rows = torch.cat([tokens[j * h : (j + 1) * h] for j in audit["micro_batches"]])
    H_sub = _subset_hessian(model, rows)
    assert audit["tokens_audited"] == rows[:, 1:].numel()
    for d in audit["directions"]:
        v = {
            "noise": lambda d=d: g[d.get("batch_index", 0)] - g_bar,
            "random": lambda d=d: rademacher(H.shape[0], 11, d.get("index", 0)),
            "gradient": lambda: g_bar,
        }[d["kind"]]()
        _assert_close(d["float64"], float(v @ H_sub @ v))
        assert d["relative_error"] < 1e-10
    assert {d["batch_index"] for d in audit["directions"] if d["kind"] == "noise"} <= {
        r["batch_index"] for r in result["noise_samples"]
    }
    # float32: production values equal a separate float32 run on the audited rows
    model32 = copy.deepcopy(model).float()
    cpu32 = Precision(torch.device("cpu"), torch.float32)
    result = measure_case(model32, _inputs(config, cache, plan, noise_samples=3, hvp_batch_size=h, audit=(2, 2)), cpu32)
    audit = result["audit"]
    randoms = [d for d in audit["directions"] if d["kind"] == "random"]
    V = torch.stack([rademacher(H.shape[0], 11, d["index"]) for d in randoms])
    separate = EpochHessian(
        model32, rows, batch_size=h, engine="double_backward", precision=cpu32, directions_per_pass=2
    ).quadratic_forms(V.float())
    H32_sub = _subset_hessian(copy.deepcopy(model32).double(), rows)
    for d, q, v in zip(randoms, separate.tolist(), V, strict=True):
        assert d["production"] == pytest.approx(q, rel=1e-4)  # another engine in float32: rounding apart
        _assert_close(d["float64"], float(v @ H32_sub @ v))  # ±1 directions are exact in float32
        assert d["relative_error"] == pytest.approx(abs(d["production"] - d["float64"]) / abs(d["float64"]))
        assert 0 < d["relative_error"] < 1e-4
    assert audit["max_relative_error"] == max(d["relative_error"] for d in audit["directions"])
    errors = audit["statistics_relative_error"]
    expected = abs(sum(d["production"] - d["float64"] for d in randoms) / sum(d["float64"] for d in randoms))
    assert errors["random_curvature"] == pytest.approx(expected)
    # end to end: ḡ and the loss over the whole epoch in float64 (of the float32 weights), and the
    # gradient direction measured as each precision built it
    exact64 = copy.deepcopy(model32).double()
    g_bar64 = mean_gradient(
        exact64,
        FlatParameters(exact64),
        [cache.tokens(b) for b in plan.blocks],
        config.training.micro_batch_size,
        CPU64,
    )
    assert audit["full_grad_norm"] == {
        "production": result["statistics"]["full_grad_norm"],
        "float64": pytest.approx(float(g_bar64.norm()), rel=1e-12),
    }
    assert errors["full_grad_norm"] == pytest.approx(
        abs(result["statistics"]["full_grad_norm"] / float(g_bar64.norm()) - 1)
    )
    gradient = next(d for d in audit["directions"] if d["kind"] == "gradient")
    _assert_close(gradient["float64"], float(g_bar64 @ H32_sub @ g_bar64))
    assert errors["grad_curvature"] == pytest.approx(gradient["relative_error"])
    assert audit["loss"]["production"] == result["statistics"]["loss"]
    assert audit["max_statistic_relative_error"] == max(v for v in errors.values() if v is not None)
    assert result["timing"]["audit_seconds"] == audit["seconds"] > 0
    assert measure_case(model32, _inputs(config, cache, plan, noise_samples=3), cpu32)["audit"] is None


def test_block_statistics_equal_a_dense_per_block_computation(oracle):
    """Per parameter block (embedding, each layer's attention and MLP, norms; the head is tied):
    ‖ḡ_b‖, mean ‖gᵢ,b‖ and ‖vᵢ,b‖ with their standard errors, B_simple per block and the shares,
    from the oracle's per-batch gradients sliced by hand; the squared block norms add up to the model's."""
    config, cache, model, plan, H, g_bar, g = oracle
    result = measure_case(model, _inputs(config, cache, plan, noise_samples=3), CPU64)
    chosen = noise_batch_indices(len(plan), 3, 11)
    names = [n for n, _ in model.named_parameters()]
    offsets = torch.tensor([0] + [p.numel() for p in model.parameters()]).cumsum(0).tolist()

    def block(name):
        if "norm" in name:
            return "norms"
        if name.startswith("layers."):
            return f"layer {name.split('.')[1]} {'attention' if '.attention.' in name else 'mlp'}"
        return "embedding"

    expected_blocks = ["embedding"] + [
        f"layer {i} {p}" for i in range(config.model.n_layers) for p in ("attention", "mlp")
    ]
    expected_blocks.append("norms")
    assert [r["block"] for r in result["blocks"]] == expected_blocks

    def part(x, b):
        return torch.cat([x[offsets[i] : offsets[i + 1]] for i, n in enumerate(names) if block(n) == b])

    B, M, fpc = 3, 15, 1 - 3 / 5
    c = (M - 1) / (M - B)

    def se(values):
        return math.sqrt(fpc * float(torch.tensor(values, dtype=torch.float64).var()) / len(values))

    for row in result["blocks"]:
        b = row["block"]
        vv = [float(part(g[i] - g_bar, b).pow(2).sum()) for i in chosen]
        grads = [float(part(g[i], b).norm()) for i in chosen]
        g2 = float(part(g_bar, b).pow(2).sum())
        assert row["parameters"] == part(g_bar, b).numel()
        _assert_close(row["full_grad_norm"], math.sqrt(g2))
        _assert_close(row["mean_grad_norm"], sum(grads) / 3)
        _assert_close(row["mean_grad_norm_se"], se(grads))
        _assert_close(row["mean_noise_norm"], sum(math.sqrt(x) for x in vv) / 3)
        _assert_close(row["mean_noise_norm_se"], se([math.sqrt(x) for x in vv]))
        _assert_close(row["b_simple"], B * c * sum(vv) / 3 / g2)
        _assert_close(row["b_simple_se"], B * c * se(vv) / g2)
        _assert_close(row["gradient_share"], g2 / float(g_bar @ g_bar))
        _assert_close(row["noise_share"], sum(vv) / sum(float((g[i] - g_bar).pow(2).sum()) for i in chosen))
    assert sum(r["parameters"] for r in result["blocks"]) == H.shape[0]
    assert math.fsum(r["noise_share"] for r in result["blocks"]) == pytest.approx(1, rel=1e-12)
    for record in result["noise_samples"]:
        assert math.fsum(record["block_noise_squared_norms"]) == pytest.approx(record["noise_squared_norm"], rel=1e-12)


@pytest.mark.parametrize("engine", ["double_backward", "adjoint"])
def test_block_diagonal_forms_equal_the_dense_hessians_blocks(oracle, engine):
    """With block_curvature: each block's vᵢ,bᵀH_bb vᵢ,b and ḡ_bᵀH_bb ḡ_b from the dense Hessian's
    diagonal blocks, their means, standard errors and B_noise per block; without it they are null."""
    config, cache, model, plan, H, g_bar, g = oracle
    result = measure_case(
        model, _inputs(config, cache, plan, noise_samples=3, engine=engine, block_curvature=True), CPU64
    )
    chosen = noise_batch_indices(len(plan), 3, 11)
    names = [n for n, _ in model.named_parameters()]
    offsets = torch.tensor([0] + [p.numel() for p in model.parameters()]).cumsum(0).tolist()
    blocks = parameter_blocks(names)
    B, M, fpc = 3, 15, 1 - 3 / 5
    c = (M - 1) / (M - B)
    for b, (row, (_, indices)) in enumerate(zip(result["blocks"], blocks, strict=True)):
        mask = torch.zeros(H.shape[0], dtype=torch.bool)
        for i in indices:
            mask[offsets[i] : offsets[i + 1]] = True
        H_bb = H[mask][:, mask]
        vhv = [float((g[i] - g_bar)[mask] @ H_bb @ (g[i] - g_bar)[mask]) for i in chosen]
        gHg = float(g_bar[mask] @ H_bb @ g_bar[mask])
        for record, q in zip(result["noise_samples"], vhv, strict=True):
            _assert_close(record["block_noise_curvatures"][b], q)
        _assert_close(row["noise_curvature"], sum(vhv) / 3)
        _assert_close(
            row["noise_curvature_se"], math.sqrt(fpc * float(torch.tensor(vhv, dtype=torch.float64).var()) / 3)
        )
        _assert_close(row["grad_curvature"], gHg)
        _assert_close(row["b_noise"], B * c * sum(vhv) / 3 / gHg if gHg > 0 else None)
    plain = measure_case(model, _inputs(config, cache, plan, noise_samples=3, engine=engine), CPU64)
    assert all(row["b_noise"] is None and row["grad_curvature"] is None for row in plain["blocks"])
    assert "block_noise_curvatures" not in plain["noise_samples"][0]
    assert result["counts"]["hvp_passes"] > plain["counts"]["hvp_passes"]
