"""The curvature operator: every engine, K and curvature batch size equals the dense Hessian."""

import math
from pathlib import Path

import pytest
import torch
from oracles import EXACT_ENGINES, FORM_ENGINES
from torch.func import functional_call, hessian

from tiny_llm.config import load_config
from tiny_llm.curvature import products
from tiny_llm.curvature.engines import ENGINES
from tiny_llm.curvature.hessian import EpochHessian, FlatParameters, Precision, pad_sequences
from tiny_llm.model.causal import IGNORE_INDEX, token_losses
from tiny_llm.model.llama import Llama

REPO = Path(__file__).resolve().parents[3]

CPU64 = Precision(torch.device("cpu"), torch.float64)


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

    dense = hessian(loss)(op.context.theta)
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
        return products._pearlmutter(op.context, theta, V, inputs, targets, n_targets)

    op.context.functions["pearlmutter"] = record  # what the engine would compile, recorded instead
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(op.hvp(V[:1]), V[:1] @ H, rtol=0, atol=1e-10)
    assert {rows for rows, *_ in fed} == {1}
    fed.clear()
    torch.testing.assert_close(op.hvp(V), V @ H, rtol=0, atol=1e-10)
    assert {rows for rows, *_ in fed} == {4} and len(fed) == 3  # 7 rows: micro-batches of 3, 3 and 1 + 2 padding
    assert len({(x, y) for _, x, y, _ in fed}) == 1  # one layout for every micro-batch
    assert all(isinstance(n, torch.Tensor) and n.dim() == 0 and float(n) == op.n_targets for *_, n in fed)


def test_only_the_pearlmutter_engine_is_compiled(dense_problem):
    """The jets are not compiled: compiling the adjoint engine whole returned wrong forms (its record
    pass loses the adjoints), so it is refused, as for every engine but Pearlmutter."""
    model, tokens, _ = dense_problem
    for engine in (name for name in ENGINES if not ENGINES[name].compiled):
        with pytest.raises(ValueError, match="only the pearlmutter engine is compiled"):
            EpochHessian(model, tokens, batch_size=3, engine=engine, precision=CPU64, compile=True)


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
