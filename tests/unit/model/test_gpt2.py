"""The GPT-2 architecture: every layer's second-order rule against torch.func (jvp of jvp), the
whole model's jet and every curvature engine against the dense Hessian, the attention backends
against each other, and the architecture switch."""

import functools

import pytest
import torch
from oracles import (
    EXACT_ENGINES,
    EXACT_PRODUCT_ENGINES,
    check_module_jet,
    check_whole_model_jet,
    dense_epoch_hessian,
    jet_generator,
    jet_randn,
    reference_jet,
)
from oracles import JET_K as K

from tiny_llm.architectures import build_model
from tiny_llm.config import ModelConfig, config_from_dict
from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.model.causal import check_jet_rules, count_parameters
from tiny_llm.model.gpt2 import GPT2, gelu, gelu_jet
from tiny_llm.model.jets import Jet
from tiny_llm.model.llama import Llama

CPU64 = Precision(torch.device("cpu"), torch.float64)
GPT2_MODEL = ModelConfig(architecture="gpt2", vocab_size=16, d_model=8, n_layers=2, n_heads=2, d_ff=16, max_seq_len=8)


def _model(tie=True, seed=0, scale=0.3):
    """A float64 GPT-2 with every parameter random (biases and LayerNorm included, so that every
    term of every rule is exercised)."""
    torch.manual_seed(seed)
    model = GPT2(ModelConfig(**{**GPT2_MODEL.__dict__, "tie_embeddings": tie})).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


@pytest.mark.parametrize("second_order_input", [True, False])
def test_layernorm_rule(second_order_input):
    x0 = jet_randn(2, 5, 8, seed=2)
    check_module_jet(
        _model().layers[0].attention_norm, lambda m, x, j: m.jet(x, j), x0, second_order_input=second_order_input
    )


def test_gelu_rule_and_formula():
    a0, a1, a2 = jet_randn(40, seed=20) * 3, jet_randn(K, 40, seed=21), jet_randn(K, 40, seed=22)
    for second in (a2, None):
        out = gelu_jet(Jet(a0, a1, second))
        for k in range(K):
            y1, y2 = reference_jet(lambda t, x: gelu(x), a0, a1[k], torch.zeros_like(a0) if second is None else a2[k])
            torch.testing.assert_close((out.z1[k], out.z2[k]), (y1, y2), rtol=0, atol=1e-13)
    # GPT-2's gelu_new, as PyTorch's tanh-approximated GELU computes it
    torch.testing.assert_close(gelu(a0), torch.nn.functional.gelu(a0, approximate="tanh"), rtol=0, atol=1e-15)


def test_attention_mlp_and_block_rules():
    model = _model()
    x0 = jet_randn(2, 5, 8, seed=3)
    check_module_jet(model.layers[0].attention, lambda m, x, j: m.jet(x, j), x0)
    check_module_jet(model.layers[0].feed_forward, lambda m, x, j: m.jet(x, j), x0, seed=5)
    check_module_jet(model.layers[1], lambda m, x, j: m.jet(x, j), x0, seed=7)
    check_module_jet(model.layers[1], lambda m, x, j: m.jet(x, j), x0, second_order_input=False, seed=9)


@pytest.mark.parametrize("tie", [True, False])
def test_whole_model_jet_is_the_second_directional_derivative(tie):
    """GPT2.jet + loss_jet in Taylor mode = d²/dt² of the summed loss along θ + t v, with ignored
    targets, tied and untied head."""
    check_whole_model_jet(_model(tie))


@functools.cache
def _dense(tie):
    """A random float64 GPT-2, 5 sequences and their explicit epoch Hessian (once per head kind)."""
    model = _model(tie, seed=1)
    tokens = torch.randint(0, 16, (5, 7), generator=jet_generator(2))
    return model, tokens, dense_epoch_hessian(model, tokens)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("engine", EXACT_ENGINES)
def test_every_engine_equals_the_dense_hessian(tie, engine):
    """Quadratic forms (and, for the HVP engines, products) of the epoch Hessian of a GPT-2 in
    float64, uneven micro-batches, K = 3: the explicit torch.func Hessian to 1e-10."""
    model, tokens, H = _dense(tie)
    check_jet_rules(model)
    V = torch.randn(4, H.shape[0], dtype=torch.float64, generator=jet_generator(3))
    op = EpochHessian(model, tokens, batch_size=2, engine=engine, precision=CPU64, directions_per_pass=3)
    torch.testing.assert_close(op.quadratic_forms(V), ((V @ H) * V).sum(1), rtol=0, atol=1e-10)
    if engine in EXACT_PRODUCT_ENGINES:
        torch.testing.assert_close(op.hvp(V), V @ H, rtol=0, atol=1e-10)


def test_backends_parameters_and_the_architecture_switch():
    model = _model()
    sdpa = GPT2(model.config, attention_backend="sdpa").double()
    sdpa.load_state_dict(model.state_dict())
    idx = torch.randint(0, 16, (2, 8), generator=jet_generator(4))
    torch.testing.assert_close(sdpa(idx), model(idx), rtol=0, atol=1e-12)
    C, f, V, T, L = 8, 16, 16, 8, 2
    per_layer = 2 * (2 * C) + (C * 3 * C + 3 * C) + (C * C + C) + (C * f + f) + (f * C + C)
    assert count_parameters(model) == V * C + T * C + L * per_layer + 2 * C
    assert count_parameters(_model(tie=False)) == count_parameters(model) + V * C
    assert type(build_model(GPT2_MODEL)) is GPT2 and type(build_model(ModelConfig())) is Llama
    with pytest.raises(ValueError, match="exceeds model.max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="model.architecture"):
        config_from_dict({"model": {"architecture": "gpt3"}})
    ModelConfig(architecture="gpt2", d_model=9, n_heads=3)  # odd head_dim: no RoPE, allowed
    with pytest.raises(ValueError, match="model.n_heads"):
        ModelConfig(d_model=9, n_heads=3)
