"""The gradients of a (state, case) and the seeded draws: ḡ and the batch gradients equal plain
autograd of the token-mean loss in float64 however the micro-batches are cut, the forward-only
epoch loss is ḡ's loss, the noise batches and Rademacher signs are fixed functions of the seed (a
rank's slice of the signs equal to the whole draw's entries), and the gradient's rounding floor is
float64's for a float64 model."""

import torch
from oracles import TINY_MODEL

from tiny_llm.curvature.gradients import (
    batch_gradient_and_loss,
    epoch_loss,
    gradient_rounding,
    mean_gradient_and_loss,
)
from tiny_llm.curvature.hessian import FlatParameters, Precision
from tiny_llm.model.causal import token_losses
from tiny_llm.model.llama import Llama

CPU64 = Precision(torch.device("cpu"), torch.float64)


def _problem():
    torch.manual_seed(0)
    model = Llama(TINY_MODEL, attention_backend="reference").double()
    batches = list(torch.randint(0, 16, (4, 3, 7), generator=torch.Generator().manual_seed(1)))
    return model, batches


def _autograd(model, tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
    model.zero_grad(set_to_none=True)
    loss = token_losses(model(tokens[:, :-1]), tokens[:, 1:]).mean()
    loss.backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return g, float(loss.detach())


def test_the_gradients_are_autograds_however_the_micro_batches_are_cut():
    model, batches = _problem()
    flat = FlatParameters(model)
    expected, expected_loss = _autograd(model, torch.cat(batches))
    for rows in (1, 2, 3):
        g, loss = mean_gradient_and_loss(model, flat, batches, rows, CPU64)
        torch.testing.assert_close(g, expected, rtol=1e-12, atol=1e-15)
        assert abs(loss - expected_loss) < 1e-13
        assert abs(epoch_loss(model, batches, rows, CPU64) - loss) < 1e-14  # forward passes only
        g1, loss1 = batch_gradient_and_loss(model, flat, batches[1], rows, CPU64)
        reference, reference_loss = _autograd(model, batches[1])
        torch.testing.assert_close(g1, reference, rtol=1e-12, atol=1e-15)
        assert abs(loss1 - reference_loss) < 1e-13


def test_a_float64_models_gradient_rounds_at_float64():
    model, batches = _problem()
    assert gradient_rounding(model, batches[0], CPU64) < 1e-9
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), _problem()[0].parameters(), strict=True))
