"""Cross-seed geometry against exact dense computations on tiny float64 models."""

import math

import pytest
import torch
from torch.func import functional_call, hessian, jacrev

from tiny_llm.config import ModelConfig
from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.geometry.metrics import (
    batch_gradients,
    concentration,
    cosine_matrix,
    cross_batch_cosine,
    fisher_trace,
    function_gradients,
    hessian_trace,
    jacobian_frobenius,
    random_overlap,
    reference_gradient,
    subspace_overlap,
    top_subspace,
)
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama

CPU64 = Precision(torch.device("cpu"), torch.float64)
SHAPE = ModelConfig(vocab_size=8, d_model=4, n_heads=2, d_ff=6, n_layers=1, max_seq_len=8)


def _model(seed: int) -> Llama:
    torch.manual_seed(seed)
    model = Llama(SHAPE, attention_backend="reference").double()
    with torch.no_grad():  # away from initialisation's tiny weights, so curvature is far from 0
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _rows(seed: int, n: int = 6, T: int = 5) -> torch.Tensor:
    return torch.randint(0, SHAPE.vocab_size, (n, T + 1), generator=torch.Generator().manual_seed(seed))


def _dense(model: Llama):
    """θ, the logits of rows' inputs as a function of θ, and the token-mean loss as one."""
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()])

    def logits(rows):
        return lambda t: functional_call(model, flat.unflatten(t), (rows[:, :-1],))

    def loss(rows):
        return lambda t: token_losses(logits(rows)(t), rows[:, 1:]).mean()

    return theta, logits, loss


def _permute_hidden_units(model: Llama, seed: int) -> Llama:
    """The same function: the feed-forward hidden units of the layer in another order."""
    twin = _model(0)
    twin.load_state_dict(model.state_dict())
    ff = twin.layers[0].feed_forward
    order = torch.randperm(SHAPE.d_ff, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ff.w1.weight.copy_(ff.w1.weight[order])
        ff.w3.weight.copy_(ff.w3.weight[order])
        ff.w2.weight.copy_(ff.w2.weight[:, order])
    return twin


def test_fisher_trace_is_the_mean_squared_row_gradient():
    model, rows = _model(1), _rows(1)
    theta, _, loss = _dense(model)
    exact = sum(
        float(torch.autograd.functional.jacobian(loss(rows[s : s + 1]), theta).square().sum()) for s in range(len(rows))
    ) / len(rows)
    assert fisher_trace(model, rows) == pytest.approx(exact, rel=1e-10)


def test_jacobian_frobenius_converges_to_the_dense_jacobian():
    model, rows = _model(2), _rows(2, n=2, T=3)
    theta, logits, _ = _dense(model)
    J = jacrev(logits(rows))(theta)
    exact = float(J.square().sum()) / J[..., 0].numel()
    estimate, se = jacobian_frobenius(model, rows, 400, seed=0)
    assert abs(estimate - exact) < 4 * se and se < 0.1 * exact


def test_hessian_trace_converges_to_the_dense_hessian():
    model, rows = _model(3), _rows(3, n=3, T=4)
    theta, _, loss = _dense(model)
    H = hessian(loss(rows))(theta)
    estimate, se = hessian_trace(model, rows, 300, seed=5, batch_size=2, precision=CPU64)
    assert abs(estimate - float(H.trace())) < 4 * se
    one, _ = hessian_trace(model, rows, 1, seed=5, batch_size=3, precision=CPU64)  # each probe exactly vᵀHv
    from tiny_llm.curvature.vectors import rademacher

    v = rademacher(len(theta), 5, 0)
    assert one == pytest.approx(float(v @ H @ v), rel=1e-10)


def test_function_gradients_are_jacobian_vector_products():
    model, rows, reference = _model(4), _rows(4), _rows(40, n=2)
    theta, logits, _ = _dense(model)
    G = batch_gradients(model, [rows[:3], rows[3:]], micro_batch_size=2, precision=CPU64)
    J = jacrev(logits(reference))(theta).reshape(-1, len(theta))
    assert torch.allclose(function_gradients(model, G, reference), G @ J.T, atol=1e-12, rtol=1e-10)
    _, _, loss = _dense(model)
    assert torch.allclose(G[0], torch.autograd.functional.jacobian(loss(rows[:3]), theta), atol=1e-12)


def test_reference_gradient_is_the_token_mean_over_every_row():
    model, rows = _model(5), _rows(5)
    theta, _, loss = _dense(model)
    g, value = reference_gradient(model, rows, micro_batch_size=4, precision=CPU64)
    assert torch.allclose(g, torch.autograd.functional.jacobian(loss(rows), theta), atol=1e-12)
    assert value == pytest.approx(float(loss(rows)(theta)), rel=1e-12)


def test_concentration_is_the_spectrum_of_the_gradient_covariance():
    G = torch.randn(5, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    centred = G - G.mean(0)
    covariance = centred.T @ centred / len(G)  # D x D
    dense = torch.linalg.eigvalsh(covariance).flip(0)[:5].clamp(min=0)
    result = concentration(G, k=2)
    assert torch.allclose(torch.tensor(result["eigenvalues"], dtype=torch.float64), dense, atol=1e-12)
    assert result["top_k_share"] == pytest.approx(float(dense[:2].sum() / dense.sum()), rel=1e-12)
    assert 1 < result["effective_rank"] <= 4 + 1e-9  # m - 1 = 4 directions at most (centred)
    one_direction = torch.outer(torch.arange(5.0, dtype=torch.float64), torch.ones(40, dtype=torch.float64))
    assert concentration(one_direction, k=1)["effective_rank"] == pytest.approx(1.0, abs=1e-12)
    assert concentration(torch.ones(3, 4, dtype=torch.float64), k=1)["effective_rank"] is None


def test_the_same_seed_twice_gives_cosine_one_and_overlap_one():
    a, b, rows, reference = _model(6), _model(6), _rows(6), _rows(60, n=2)
    batches = [rows[:2], rows[2:4], rows[4:]]
    G_a, G_b = (batch_gradients(m, batches, micro_batch_size=2, precision=CPU64) for m in (a, b))
    g = torch.stack([reference_gradient(m, rows, micro_batch_size=2, precision=CPU64)[0] for m in (a, b)])
    assert float(cosine_matrix(g)[0, 1]) == pytest.approx(1.0, abs=1e-12)
    assert subspace_overlap(top_subspace(G_a, 2), top_subspace(G_b, 2)) == pytest.approx(1.0, abs=1e-12)
    F_a, F_b = (function_gradients(m, G, reference) for m, G in ((a, G_a), (b, G_b)))
    assert subspace_overlap(top_subspace(F_a, 2), top_subspace(F_b, 2)) == pytest.approx(1.0, abs=1e-12)
    assert cross_batch_cosine(F_a) == pytest.approx(cross_batch_cosine(F_b), abs=1e-12)


def test_permuted_hidden_units_change_parameter_space_and_not_function_space():
    model, rows, reference = _model(7), _rows(7), _rows(70, n=2)
    twin = _permute_hidden_units(model, seed=1)
    assert torch.allclose(model(reference[:, :-1]), twin(reference[:, :-1]), atol=1e-12)  # the same function
    batches = [rows[:2], rows[2:4], rows[4:]]
    G, G_twin = (batch_gradients(m, batches, micro_batch_size=2, precision=CPU64) for m in (model, twin))
    F, F_twin = function_gradients(model, G, reference), function_gradients(twin, G_twin, reference)
    assert torch.allclose(F, F_twin, atol=1e-12)  # function space: unchanged
    assert subspace_overlap(top_subspace(F, 2), top_subspace(F_twin, 2)) == pytest.approx(1.0, abs=1e-10)
    assert cross_batch_cosine(F) == pytest.approx(cross_batch_cosine(F_twin), abs=1e-12)
    g = torch.stack([G.mean(0), G_twin.mean(0)])
    assert float(cosine_matrix(g)[0, 1]) < 0.99  # parameter space: changed by the relabelling
    assert subspace_overlap(top_subspace(G, 2), top_subspace(G_twin, 2)) < 0.99
    assert fisher_trace(model, rows) == pytest.approx(fisher_trace(twin, rows), rel=1e-10)  # traces: invariant


def test_random_subspaces_overlap_k_over_d():
    d, k, draws = 60, 4, 300
    generator = torch.Generator().manual_seed(0)
    values = [
        subspace_overlap(
            top_subspace(torch.randn(k, d, generator=generator, dtype=torch.float64), k),
            top_subspace(torch.randn(k, d, generator=generator, dtype=torch.float64), k),
        )
        for _ in range(draws)
    ]
    mean = sum(values) / draws
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (draws - 1) / draws)
    assert abs(mean - random_overlap(d, k)) < 4 * se


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="k must be between 1 and 3"):
        top_subspace(torch.zeros(3, 10), 4)
    with pytest.raises(ValueError, match="subspaces of different shapes"):
        subspace_overlap(torch.zeros(10, 2), torch.zeros(10, 3))
    with pytest.raises(ValueError, match="at least 2 batches"):
        cross_batch_cosine(torch.ones(1, 5))


def test_the_llc_without_devinterp_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "devinterp", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "devinterp.slt.llc", None)
    from tiny_llm.geometry.metrics import SGLD, local_learning_coefficient

    with pytest.raises(ValueError, match=r"needs devinterp 2.0.1: pip install 'tiny-llm-curvature\[llc\]'"):
        sampler = SGLD(chains=2, draws=5, lr=1e-4, n_beta=None, localization=100.0)
        local_learning_coefficient(_model(0), _rows(0), sampler, batch_size=2, seed=0)


@pytest.mark.llc
def test_the_llc_by_devinterp_on_a_tiny_model():
    pytest.importorskip("devinterp")
    from tiny_llm.geometry.metrics import SGLD, local_learning_coefficient

    model, rows = _model(8), _rows(8, n=8)
    before = [p.detach().clone() for p in model.parameters()]
    sampler = SGLD(chains=2, draws=30, lr=1e-4, n_beta=None, localization=100.0)
    mean, se = local_learning_coefficient(model, rows, sampler, batch_size=4, seed=3)
    again, _ = local_learning_coefficient(model, rows, sampler, batch_size=4, seed=3)
    assert math.isfinite(mean) and math.isfinite(se) and se >= 0
    assert again == mean  # reproducible from its seed
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # the model is not changed
