"""The curvature operator: every engine, K and curvature batch size equals the dense Hessian."""

import math
from pathlib import Path

import pytest
import torch
from oracles import EXACT_ENGINES, EXACT_PRODUCT_ENGINES, FORM_ENGINES, dense_gauss_newton
from torch.func import functional_call, hessian

from tiny_llm.config import load_config
from tiny_llm.curvature import products
from tiny_llm.curvature.engines import ENGINES
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision, pad_sequences
from tiny_llm.model.causal import IGNORE_INDEX, token_losses
from tiny_llm.model.llama import Llama

REPO = Path(__file__).resolve().parents[3]

CPU64 = Precision(torch.device("cpu"), torch.float64)


@pytest.mark.parametrize("engine", EXACT_PRODUCT_ENGINES)
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 10])
def test_hvp_equals_dense_hessian(dense_problem, engine, K, batch_size):
    model, tokens, H = dense_problem
    V = torch.randn(5, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(K))
    op = EpochHessian(model, tokens, batch_size=batch_size, engine=engine, precision=CPU64, directions_per_pass=K)
    torch.testing.assert_close(op.hvp(V), V @ H, rtol=0, atol=1e-10)
    torch.testing.assert_close(op.quadratic_forms(V), ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    assert op.passes == 2 * -(-5 // K)
    assert op.n_targets == 7 * 6 and all(len(x) == batch_size for x, _ in op.batches)


@pytest.mark.parametrize("engine", FORM_ENGINES)
@pytest.mark.parametrize("K", [1, 3, 16])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 10])
def test_quadratic_form_engines_equal_dense_hessian(dense_problem, engine, K, batch_size):
    """vᵀHv without Hv, in float64, to 1e-10 of the explicit Hessian (padded last micro-batch included)."""
    model, tokens, H = dense_problem
    V = torch.randn(20, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(K + batch_size))
    op = EpochHessian(model, tokens, batch_size=batch_size, engine=engine, precision=CPU64, directions_per_pass=K)
    torch.testing.assert_close(op.quadratic_forms(V), ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    assert op.passes == -(-20 // K)


@pytest.mark.parametrize("engine", FORM_ENGINES)
@pytest.mark.parametrize("K, batch_size", [(1, 7), (3, 3), (16, 10)])
def test_gauss_newton_split_equals_dense_jacobian_product(dense_problem, engine, K, batch_size):
    """Each form's Gauss–Newton part equals vᵀJᵀ∇²ℓJv from the dense Jacobian, the forms stay those
    of the dense Hessian, and G is positive semi-definite while H is not."""
    model, tokens, H = dense_problem
    G = dense_gauss_newton(model, tokens)
    assert torch.linalg.eigvalsh(G).min() > -1e-12 and torch.linalg.eigvalsh(H).min() < -1e-6
    V = torch.randn(20, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(K))
    op = EpochHessian(model, tokens, batch_size=batch_size, engine=engine, precision=CPU64, directions_per_pass=K)
    forms, parts = op.split_quadratic_forms(V)
    torch.testing.assert_close(forms, ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    torch.testing.assert_close(parts, ((V @ G) * V).sum(1), rtol=0, atol=1e-10)
    assert op.passes == -(-20 // K)  # in the passes of the forms, not extra ones
    with pytest.raises(ValueError, match="Gauss–Newton split needs a quadratic-form engine"):
        EpochHessian(model, tokens, batch_size=3, engine="double_backward", precision=CPU64).split_quadratic_forms(V)


def test_gauss_newton_split_with_ignored_targets(dense_problem):
    model, tokens, _ = dense_problem
    targets = tokens[:, 1:].clone()
    targets[0, 1:3], targets[2, -1] = IGNORE_INDEX, IGNORE_INDEX
    G = dense_gauss_newton(model, tokens, ignored=[(0, 1), (0, 2), (2, 5)])
    op = EpochHessian(model, tokens, batch_size=7, engine="adjoint", precision=CPU64, directions_per_pass=4)
    op.n_targets = int((targets != IGNORE_INDEX).sum())
    V = torch.randn(4, G.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    _, parts = op.batch_split_forms(V, tokens[:, :-1], targets)
    torch.testing.assert_close(parts, ((V @ G) * V).sum(1), rtol=0, atol=1e-10)


@pytest.mark.parametrize("engine", EXACT_ENGINES)
def test_ignored_targets_inside_a_micro_batch(dense_problem, engine):
    """One micro-batch whose targets are partly ignored: its share of the epoch form equals the dense
    Hessian of Σ ℓ_t / N over the kept targets."""
    model, tokens, H = dense_problem
    inputs, targets = tokens[:4, :-1], tokens[:4, 1:].clone()
    targets[0, 1:3], targets[2, -1] = IGNORE_INDEX, IGNORE_INDEX
    op = EpochHessian(model, tokens, batch_size=4, engine=engine, precision=CPU64, directions_per_pass=2)
    flat = FlatParameters(model)

    def loss(x):
        return token_losses(functional_call(model, flat.unflatten(x), (inputs,)), targets).sum() / op.n_targets

    dense = hessian(loss)(op.theta)
    V = torch.randn(2, flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(op.batch_forms(V, inputs, targets), ((V @ dense) * V).sum(1), rtol=0, atol=1e-10)


def _demo_problem(n_sequences=16):
    """The demo model shape (D = 28,832) at its initialisation, a few random sequences."""
    config = load_config(REPO / "config/runs/demo.yaml")
    torch.manual_seed(0)
    model = Llama(config.model, attention_backend="reference").double()
    tokens = torch.randint(
        0, config.model.vocab_size, (n_sequences, config.data.seq_len + 1), generator=torch.Generator().manual_seed(1)
    )
    return model, tokens


def test_every_engine_agrees_on_the_demo_model():
    """Switching the engine of a campaign changes its numbers only by rounding: float64 agreement to
    1e-12 relative on the demo model; float32 within the stated bound, 1e-5 of the forms' RMS
    (measured ≤ 1.3e-6 for taylor and adjoint, 1e-7 for the HVP engines)."""
    model, tokens = _demo_problem()
    V = torch.randn(4, FlatParameters(model).D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    forms = {
        e: EpochHessian(model, tokens, batch_size=8, engine=e, precision=CPU64, directions_per_pass=2).quadratic_forms(
            V
        )
        for e in (*FORM_ENGINES, "double_backward")
    }
    rms = forms["double_backward"].pow(2).mean().sqrt()
    for engine in FORM_ENGINES:
        assert float((forms[engine] - forms["double_backward"]).abs().max() / rms) < 1e-12
    model32 = Llama(model.config, attention_backend="reference")
    model32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    for engine in FORM_ENGINES:
        op = EpochHessian(
            model32,
            tokens,
            batch_size=8,
            engine=engine,
            precision=Precision(torch.device("cpu"), torch.float32),
            directions_per_pass=4,
        )
        assert float((op.quadratic_forms(V.float()) - forms["double_backward"]).abs().max() / rms) < 1e-5


def test_padding_rows_are_ignored():
    tokens = torch.arange(12).view(3, 4)
    batches = pad_sequences(tokens, 2)
    assert len(batches) == 2 and batches[1][0].shape == (2, 3)
    assert (batches[1][1][1] == IGNORE_INDEX).all() and (batches[1][1][0] == tokens[2, 1:]).all()


def test_amp_forward_is_close_to_float32(dense_problem):
    model, tokens, H = dense_problem
    model32 = Llama(model.config, attention_backend="reference")
    model32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    V = torch.randn(2, H.shape[0], generator=torch.Generator().manual_seed(9))
    exact = ((V.double() @ H) * V.double()).sum(1)
    for engine in EXACT_ENGINES:
        amp = EpochHessian(
            model32,
            tokens,
            batch_size=4,
            engine=engine,
            precision=Precision(torch.device("cpu"), torch.float32, amp=True),
            directions_per_pass=2,
        )
        torch.testing.assert_close(amp.quadratic_forms(V), exact, rtol=0.1, atol=1e-3)


def test_finite_differences_refuse_bf16_autocast(dense_problem):
    """Under bf16 autocast two gradients 2ε apart differ by the forward's rounding, not only by
    2εHv: the forms by differences miss by a tenth of their own size or more, ten times the exact
    engines' error under the same autocast, so the operator refuses the combination by name."""
    model, tokens, H = dense_problem
    model32 = Llama(model.config, attention_backend="reference")
    model32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    V = torch.randn(4, H.shape[0], generator=torch.Generator().manual_seed(9))
    exact = ((V.double() @ H) * V.double()).sum(1)
    amp = Precision(torch.device("cpu"), torch.float32, amp=True)
    with pytest.raises(ValueError, match=r"finite differences: under bf16 autocast \(amp\)"):
        EpochHessian(model32, tokens, batch_size=4, engine="finite_difference", precision=amp)
    errors = {}
    for engine in ("finite_difference", "double_backward"):
        op = EpochHessian(
            model32, tokens, batch_size=4, engine=engine, precision=Precision(torch.device("cpu"), torch.float32)
        )
        op.precision = amp  # for finite differences, what the refusal prevents
        errors[engine] = float((op.quadratic_forms(V).double() - exact).abs().max() / exact.pow(2).mean().sqrt())
    assert errors["finite_difference"] > max(0.1, 10 * errors["double_backward"]), errors


def test_operator_refuses_bad_use(dense_problem):
    model, tokens, H = dense_problem
    with pytest.raises(ValueError, match="engine: expected one of taylor, adjoint, double_backward, pearlmutter"):
        EpochHessian(model, tokens, batch_size=2, engine="finite", precision=CPU64)
    with pytest.raises(ValueError, match="needs reference attention"):
        EpochHessian(
            Llama(model.config, attention_backend="sdpa"),
            tokens,
            batch_size=2,
            engine="double_backward",
            precision=CPU64,
        )
    with pytest.raises(ValueError, match=r"directions must have shape \(K, "):
        EpochHessian(model, tokens, batch_size=2, engine="double_backward", precision=CPU64).hvp(torch.zeros(3))


def test_compiled_passes_pad_short_chunks_but_run_single_directions_alone(dense_problem):
    """What the compiled product is fed: every micro-batch with one layout (the padded last too), the
    target count as a tensor, short chunks padded to K, a single direction alone (not K× the work)."""
    model, tokens, H = dense_problem
    op = EpochHessian(
        model, tokens, batch_size=3, engine="pearlmutter", precision=CPU64, directions_per_pass=4, compile=True
    )
    fed = []

    def record(theta, V, inputs, targets, n_targets):
        fed.append((len(V), inputs.stride(), targets.stride(), n_targets))
        return products._pearlmutter(op, theta, V, inputs, targets, n_targets)

    op.functions["pearlmutter"] = record  # what the engine would compile, recorded instead
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(op.hvp(V[:1]), V[:1] @ H, rtol=0, atol=1e-10)
    assert {rows for rows, *_ in fed} == {1}
    fed.clear()
    torch.testing.assert_close(op.hvp(V), V @ H, rtol=0, atol=1e-10)
    assert {rows for rows, *_ in fed} == {4} and len(fed) == 3  # 7 rows: micro-batches of 3, 3 and 1 + 2 padding
    assert len({(x, y) for _, x, y, _ in fed}) == 1  # one layout for every micro-batch
    assert all(isinstance(n, torch.Tensor) and n.dim() == 0 and float(n) == op.n_targets for *_, n in fed)


@pytest.mark.slow
def test_compiled_pearlmutter_equals_eager_with_one_graph_per_direction_count(dense_problem):
    """torch.compile of vmap(jvp(grad)) (the CUDA default), here on CPU inductor: the products and
    forms of the eager engine, one graph for K directions whatever the micro-batch (the padded
    last included) and the epoch's target count, one more for single directions, none after."""
    model, tokens, H = dense_problem
    V = torch.randn(4, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def graphs(rows: int) -> tuple[EpochHessian, int]:
        """An operator on the first ``rows`` rows, compiled from scratch, and its graphs for K directions."""
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        op = EpochHessian(
            model,
            tokens[:rows],
            batch_size=3,
            engine="pearlmutter",
            precision=CPU64,
            directions_per_pass=2,
            compile=True,
        )
        op.hvp(V)
        return op, torch._dynamo.utils.counters["stats"]["unique_graphs"]

    _, unpadded = graphs(6)  # micro-batches of 3 and 3
    compiled, padded = graphs(7)  # 3, 3 and 1 + 2 padding rows
    assert unpadded >= 1 and padded == unpadded  # the padded micro-batch reuses the graph
    torch.testing.assert_close(compiled.hvp(V), V @ H, rtol=0, atol=1e-10)
    torch._dynamo.utils.counters.clear()
    torch.testing.assert_close(compiled.hvp(V[:1]), V[:1] @ H, rtol=0, atol=1e-10)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the single-direction graph
    torch._dynamo.utils.counters.clear()
    compiled.hvp(V)
    compiled.hvp(V[:1])
    compiled.hvp(V[:3])  # a short chunk: padded to K
    eager = EpochHessian(model, tokens, batch_size=3, engine="pearlmutter", precision=CPU64, directions_per_pass=2)
    torch.testing.assert_close(compiled.quadratic_forms(V), eager.quadratic_forms(V), rtol=1e-12, atol=0)
    compiled.n_targets_tensor.fill_(2.0 * compiled.n_targets)  # another epoch's target count: an input, not a constant
    torch.testing.assert_close(compiled.hvp(V), V @ H / 2, rtol=0, atol=1e-10)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0  # no recompilation


def test_only_the_pearlmutter_engine_is_compiled(dense_problem):
    """The jets are not compiled: compiling the adjoint engine whole returned wrong forms (its record
    pass loses the adjoints), so it is refused, as for every engine but Pearlmutter."""
    model, tokens, _ = dense_problem
    for engine in (name for name in ENGINES if not ENGINES[name].compiled):
        with pytest.raises(ValueError, match="only the pearlmutter engine is compiled"):
            EpochHessian(model, tokens, batch_size=3, engine=engine, precision=CPU64, compile=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("engine", FORM_ENGINES)
@pytest.mark.parametrize("amp", [False, True])
def test_quadratic_form_engines_on_cuda(dense_problem, engine, amp):
    """The jets on the GPU (float32 with TF32 off, and bf16 autocast) against the float64 oracle."""
    model, tokens, H = dense_problem
    cuda = Llama(model.config, attention_backend="reference").cuda()
    cuda.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    V = torch.randn(4, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    exact = ((V @ H) * V).sum(1)
    previous = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    try:
        op = EpochHessian(
            cuda,
            tokens,
            batch_size=3,
            engine=engine,
            directions_per_pass=4,
            precision=Precision(torch.device("cuda"), torch.float32, amp=amp),
        )
        forms = op.quadratic_forms(V.float()).cpu()
    finally:
        torch.backends.cuda.matmul.fp32_precision = previous
    bound = (1e-2 if amp else 1e-5) * float(exact.pow(2).mean().sqrt())
    assert float((forms - exact).abs().max()) < bound


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("group_rows", [1, 2])
def test_row_groups_change_memory_not_numbers(dense_problem, engine, group_rows):
    """A curvature micro-batch cut into groups of sequences gives the forms and products of the
    whole micro-batch (the same terms summed), to rounding in float64."""
    model, tokens, H = dense_problem
    # an engine whose own groups are B/K sequences (taylor) takes one direction: the whole micro-batch
    K = 1 if ENGINES[engine].rows_per_direction else 4
    V = torch.randn(K, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    whole = EpochHessian(model, tokens, batch_size=3, engine=engine, precision=CPU64, directions_per_pass=K)
    grouped = EpochHessian(
        model, tokens, batch_size=3, engine=engine, precision=CPU64, directions_per_pass=K, group_rows=group_rows
    )
    assert len(whole._row_groups(K, 3)) == 1
    assert len(grouped._row_groups(K, 3)) == math.ceil(3 / group_rows)
    # finite differences divide gradient differences by a step of 1e-6: their own round-off (~1e-11
    # relative here) is amplified from the last bits of the gradients, which the grouping reorders
    rtol = 1e-12 if ENGINES[engine].second_derivatives else 1e-9
    torch.testing.assert_close(grouped.quadratic_forms(V), whole.quadratic_forms(V), rtol=rtol, atol=0)
    if ENGINES[engine].products:
        grouped_hv, whole_hv = grouped.hvp(V), whole.hvp(V)
        assert float((grouped_hv - whole_hv).norm() / whole_hv.norm()) < rtol


def test_compiled_row_groups_are_equal(dense_problem):
    model, tokens, _ = dense_problem
    op = EpochHessian(model, tokens, batch_size=6, engine="pearlmutter", precision=CPU64, compile=True, group_rows=4)
    assert op._row_groups(1, 6) == [slice(0, 3), slice(3, 6)]  # the largest divisor of 6 up to 4
    with pytest.raises(ValueError, match="group_rows: expected a positive integer or None, got 0"):
        EpochHessian(model, tokens, batch_size=6, engine="adjoint", precision=CPU64, group_rows=0)
