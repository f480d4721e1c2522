"""GPT-NeoX's own layers: the exact (erf) GELU and its second-order rule against jvp of jvp, and the
model's forward against its parallel and sequential residual forms."""

import torch
from oracles import JET_K as K
from oracles import jet_randn as _randn
from oracles import reference_jet as _reference_jet

from tiny_llm.config import ModelConfig
from tiny_llm.model.gpt_neox import GPTNeoX, gelu_exact, gelu_exact_derivatives, gelu_exact_jet
from tiny_llm.model.jets import Jet


def test_exact_gelu_rule():
    a0, a1, a2 = _randn(9, seed=50) * 3, _randn(K, 9, seed=51), _randn(K, 9, seed=52)
    out = gelu_exact_jet(Jet(a0, a1, a2))
    torch.testing.assert_close(out.z0, torch.nn.functional.gelu(a0), rtol=0, atol=1e-14)
    for k in range(K):
        y1, y2 = _reference_jet(lambda t, x: gelu_exact(x), a0, a1[k], a2[k])
        torch.testing.assert_close((out.z1[k], out.z2[k]), (y1, y2), rtol=0, atol=1e-13)


def test_exact_gelu_derivatives_are_autograds():
    x = (_randn(11, seed=53) * 3).requires_grad_()
    (g1,) = torch.autograd.grad(gelu_exact(x).sum(), x, create_graph=True)
    (g2,) = torch.autograd.grad(g1.sum(), x)
    first, second = gelu_exact_derivatives(x.detach())
    torch.testing.assert_close((first, second), (g1.detach(), g2), rtol=0, atol=1e-13)


def test_the_residual_form_changes_the_logits_and_the_shapes_hold():
    config = ModelConfig(architecture="gpt_neox", vocab_size=16, d_model=8, n_heads=2, d_ff=16, n_layers=2)
    torch.manual_seed(0)
    parallel = GPTNeoX(config).double()
    sequential = GPTNeoX(ModelConfig(**{**config.__dict__, "parallel_residual": False})).double()
    sequential.load_state_dict(parallel.state_dict())  # the same parameters, the other residual form
    idx = torch.randint(0, 16, (2, 5))
    a, b = parallel(idx), sequential(idx)
    assert a.shape == b.shape == (2, 5, 16) and not torch.allclose(a, b)
