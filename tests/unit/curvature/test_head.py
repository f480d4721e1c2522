"""The output head and loss in token chunks: the loss, its gradient and its second derivative
along a direction equal the whole head's (autograd of token_losses) in float64, ignored targets
included, whatever the chunk."""

import pytest
import torch
from torch.func import jvp

from tiny_llm.curvature.head import head_gradient, head_loss
from tiny_llm.model.causal import IGNORE_INDEX, token_losses


def _whole(h, W, y, scale):
    return token_losses(h.reshape(-1, h.size(-1)) @ W.t(), y.reshape(-1)).sum() * scale


@pytest.mark.parametrize("tokens", [1, 4, 7, 100])
def test_chunked_head_equals_the_whole_head(tokens):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 5, 3, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(6, 3, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 6, (2, 5), generator=g)
    y[0, 1] = IGNORE_INDEX
    scale = 1 / 9
    torch.testing.assert_close(head_loss(h, W, y, scale, tokens), _whole(h, W, y, scale), rtol=1e-13, atol=0)
    expected = torch.autograd.grad(_whole(h, W, y, scale), (h, W), create_graph=True)
    got = head_gradient(h, W, y, scale, tokens)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    dh, dW = torch.randn_like(h), torch.randn_like(W)  # the second derivative along (dh, dW)
    _, tangent = jvp(lambda a, b: head_gradient(a, b, y, scale, tokens), (h.detach(), W.detach()), (dh, dW))
    reference = torch.autograd.grad(expected, (h, W), grad_outputs=(dh, dW))
    for a, b in zip(tangent, reference, strict=True):  # the Hessian is symmetric: Hv both ways
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-14)
