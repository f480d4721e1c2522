"""One job owns every pass of a measurement: on the dense float64 problem its mean gradient and
epoch loss, batch gradients (sampled, the known ones reused and dropped), forward-only loss, loss at
θ + Δ, curvature operator and float64 reference equal what torch.func computes directly on the same
tokens, and however the job is cut (micro-batches, curvature batches, directions per pass) the
numbers stay the same."""

import pytest
import torch
from oracles import dense_model, dense_tokens
from torch.func import functional_call, grad

from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.curvature.job import Cuts, open_job
from tiny_llm.model.causal import token_losses

CPU64 = Precision(torch.device("cpu"), torch.float64)
BATCHES = [dense_tokens()[:3], dense_tokens()[3:5], dense_tokens()[5:]]  # 3 batches of uneven rows


def _loss(model, tokens, theta=None):
    """The token-mean loss of ``tokens`` (and its gradient) at θ (the model's own by default)."""
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach() for p in model.parameters()]) if theta is None else theta

    def f(x):
        logits = functional_call(model, flat.unflatten(x), (tokens[:, :-1],))
        return token_losses(logits, tokens[:, 1:]).mean()

    return float(f(theta)), grad(f)(theta)


@pytest.mark.parametrize("cuts", [Cuts(1, 1), Cuts(2, 3, directions_per_pass=2), Cuts(3, 7, directions_per_pass=3)])
def test_every_pass_of_a_job_is_the_direct_computation_however_it_is_cut(dense_problem, cuts):
    model, _, H = dense_problem
    job = open_job(model, BATCHES, cuts, CPU64)
    everything = torch.cat(BATCHES)
    loss, g = _loss(model, everything)
    mean, epoch = job.mean_gradient_and_loss()
    assert torch.allclose(mean, g, rtol=0, atol=1e-13) and epoch == pytest.approx(loss, rel=1e-13)
    assert job.epoch_loss() == pytest.approx(loss, rel=1e-13)
    for i, tokens in enumerate(BATCHES):
        batch_loss, batch_g = _loss(model, tokens)
        g_i, loss_i = job.batch_gradient_and_loss(i)
        assert torch.allclose(g_i, batch_g, rtol=0, atol=1e-13) and loss_i == pytest.approx(batch_loss, rel=1e-13)
    step = torch.randn(H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 1e-2
    theta = FlatParameters(model).flatten([p.detach().clone() for p in model.parameters()])
    assert job.loss_at(step) == pytest.approx(_loss(model, everything, theta + step)[0], rel=1e-13)
    after = FlatParameters(model).flatten([p.detach() for p in model.parameters()])
    assert torch.equal(after, theta)  # θ restored bit for bit
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    forms = job.operator("adjoint").quadratic_forms(V)
    assert torch.allclose(forms, torch.einsum("kd,de,ke->k", V, H, V), rtol=1e-10, atol=1e-12)


def test_sampled_gradients_reuse_the_known_ones_and_drop_them_once_given(dense_problem):
    model = dense_problem[0]
    job = open_job(model, BATCHES, Cuts(2, 2), CPU64)
    sentinel = (torch.zeros(1), -1.0)
    known = {1: sentinel}
    given = list(job.sampled([2, 1, 0], known))
    assert given[1] is sentinel and known == {}
    for (g, loss), i in zip([given[0], given[2]], [2, 0], strict=True):
        expected_g, expected_loss = job.batch_gradient_and_loss(i)
        assert torch.equal(g, expected_g) and loss == expected_loss


def test_the_reference_job_is_the_same_job_in_float64_on_a_copy():
    model = dense_model().float()
    job = open_job(
        model, BATCHES, Cuts(2, 3, directions_per_pass=2, compile=True), Precision(torch.device("cpu"), torch.float32)
    )
    reference = job.reference()
    assert reference.model is not model and next(reference.model.parameters()).dtype == torch.float64
    assert reference.precision.dtype == torch.float64 and reference.cuts.passes == ("audit_gradient", "audit")
    assert not reference.cuts.compile and reference.batches is job.batches
    loss, g = _loss(reference.model, torch.cat(BATCHES))
    mean, epoch = reference.mean_gradient_and_loss()
    assert torch.allclose(mean, g, rtol=0, atol=1e-13) and epoch == pytest.approx(loss, rel=1e-13)
    assert job.epoch_loss() == pytest.approx(loss, rel=1e-5)  # float32: the same loss to its rounding
