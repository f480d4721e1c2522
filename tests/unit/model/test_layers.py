"""The shared layers' second-order rules against jvp of jvp in float64: linear maps (with and without
bias, first- and second-order inputs), embeddings, the explicit causal attention (and SiLU)."""

import pytest
import torch
from oracles import JET_K as K
from oracles import check_module_jet as _check_module_jet
from oracles import jet_randn as _randn
from oracles import reference_jet as _reference_jet
from torch import nn

from tiny_llm.model.jets import Jet, JetPass
from tiny_llm.model.layers import (
    causal_attention,
    embedding_jet,
    linear_jet,
    reference_attention,
    reference_attention_jet,
)
from tiny_llm.model.llama import silu, silu_jet


@pytest.mark.parametrize("second_order_input", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_rule(second_order_input, bias):
    x0 = _randn(2, 5, 4, seed=1)
    _check_module_jet(
        nn.Linear(4, 6, bias=bias), lambda m, x, j: linear_jet(x, m, j), x0, second_order_input=second_order_input
    )


def test_attention_core_silu_and_embedding_rules():
    q0, k0, v0 = (_randn(2, 2, 5, 4, seed=s) for s in (10, 11, 12))
    q1, k1, v1, q2, k2, v2 = (_randn(K, 2, 2, 5, 4, seed=s) for s in range(13, 19))
    out = reference_attention_jet(Jet(q0, q1, q2), Jet(k0, k1, k2), Jet(v0, v1, v2), JetPass({}), key=None)
    for k in range(K):

        def f(t, _, k=k):
            path = [
                a + t * b + 0.5 * t * t * c for a, b, c in ((q0, q1[k], q2[k]), (k0, k1[k], k2[k]), (v0, v1[k], v2[k]))
            ]
            return reference_attention(*path)

        y1, y2 = _reference_jet(f, q0, q1[k], q2[k])
        torch.testing.assert_close(out.z1[k], y1, rtol=0, atol=1e-12)
        torch.testing.assert_close(out.z2[k], y2, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.z0, reference_attention(q0, k0, v0), rtol=0, atol=1e-14)

    a0, a1, a2 = _randn(6, seed=20), _randn(K, 6, seed=21), _randn(K, 6, seed=22)
    out = silu_jet(Jet(a0, a1, a2))
    for k in range(K):
        y1, y2 = _reference_jet(lambda t, x: silu(x), a0, a1[k], a2[k])
        torch.testing.assert_close((out.z1[k], out.z2[k]), (y1, y2), rtol=0, atol=1e-14)

    embedding = nn.Embedding(7, 3).double()
    U = _randn(K, 7, 3, seed=23)
    idx = torch.tensor([[1, 6, 1]])
    out = embedding_jet(idx, embedding, JetPass({embedding.weight: U}))
    assert out.z2 is None and torch.equal(out.z1, U[:, idx]) and torch.equal(out.z0, embedding.weight[idx])


def test_the_fused_and_the_reference_attention_agree():
    q, k, v = (_randn(2, 3, 6, 4, seed=s) for s in (60, 61, 62))
    reference = causal_attention(q, k, v, "reference")
    torch.testing.assert_close(reference, reference_attention(q, k, v), rtol=0, atol=0)
    torch.testing.assert_close(causal_attention(q, k, v, "sdpa"), reference, rtol=0, atol=1e-12)
