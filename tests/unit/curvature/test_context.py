"""What an engine is given: the micro-batch's loss and gradient (at θ and at a shifted θ, restored
after), its head in token chunks where the placement allows, the whole vectors' norms, and no
placement to ask."""

import pytest
import torch
from oracles import dense_model, dense_tokens
from torch.func import functional_call, grad

from tiny_llm.curvature.context import FlatParameters, MicroBatchContext
from tiny_llm.curvature.hessian import Precision
from tiny_llm.curvature.placement import place
from tiny_llm.model.causal import token_losses

CPU64 = Precision(torch.device("cpu"), torch.float64)


def test_a_micro_batch_loss_and_gradient_are_its_share_of_the_epochs():
    model, tokens = dense_model(), dense_tokens()
    inputs, targets = tokens[:3, :-1], tokens[:3, 1:]
    context = MicroBatchContext(model, place(model), CPU64, n_targets=tokens[:, 1:].numel(), head_tokens=4)
    flat = FlatParameters(model)
    theta = flat.flatten([p.detach().clone() for p in model.parameters()])

    def share(x):
        logits = functional_call(model, flat.unflatten(x), (inputs,))
        return token_losses(logits, targets).sum() / context.n_targets

    assert float(context.loss(flat.unflatten(theta), inputs, targets)) == pytest.approx(float(share(theta)), rel=1e-14)
    assert context.head_chunked(targets) and not context.head_chunked(targets[:1, :4])  # 4 targets: one chunk
    torch.testing.assert_close(context.gradient_at(inputs, targets), grad(share)(theta), rtol=0, atol=1e-14)
    step = torch.randn(flat.D, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 1e-3
    torch.testing.assert_close(
        context.gradient_at(inputs, targets, step), grad(share)(theta + step), rtol=0, atol=1e-14
    )
    assert torch.equal(flat.flatten([p.detach() for p in model.parameters()]), theta)  # θ restored
    V = torch.randn(2, flat.D, dtype=torch.float64)
    assert context.norms(V) == pytest.approx(V.norm(dim=1).tolist(), rel=1e-15)
    assert context.theta_norm == pytest.approx(float(theta.norm()), rel=1e-15)
    assert not hasattr(context, "placement")  # an engine never asks where it runs
