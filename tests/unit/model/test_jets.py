"""Second-order jets: every layer's rule against torch.func (jvp of jvp along the same path), the
adjoint-mode contractions against Taylor mode, and the refusal of layers without a rule."""

import math

import pytest
import torch
from oracles import FORM_ENGINES, check_whole_model_jet
from oracles import JET_K as K
from oracles import check_module_jet as _check_module_jet
from oracles import jet_generator as _gen
from oracles import jet_randn as _randn
from torch import nn

from tiny_llm.architectures import build_model
from tiny_llm.config import ModelConfig, RopeScaling
from tiny_llm.curvature.hessian import EpochHessian, Precision
from tiny_llm.model.causal import check_jet_rules
from tiny_llm.model.jets import per_direction, per_direction_dot, shared_matmul
from tiny_llm.model.llama import Llama, rope_tables

CPU64 = Precision(torch.device("cpu"), torch.float64)
MODEL = ModelConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=2, d_ff=16, max_seq_len=8)


class _WithRope(nn.Module):
    """A layer whose forward takes the rotary tables, as one of one argument (for check_module_jet)."""

    def __init__(self, inner, cos, sin):
        super().__init__()
        self.inner, self.cos, self.sin = inner, cos, sin

    def forward(self, x):
        return self.inner(x, self.cos, self.sin)


@pytest.mark.parametrize("second_order_input", [True, False])
def test_rmsnorm_rule(second_order_input):
    model = Llama(MODEL)
    x0 = _randn(2, 5, 8, seed=2)
    _check_module_jet(
        model.layers[0].attention_norm, lambda m, x, j: m.jet(x, j), x0, second_order_input=second_order_input
    )


def test_attention_rule():
    model = Llama(MODEL)
    cos, sin = rope_tables(5, MODEL, torch.device("cpu"))
    attention = model.layers[0].attention.double()
    x0 = _randn(2, 5, 8, seed=3)
    _check_module_jet(_WithRope(attention, cos, sin), lambda m, x, j: attention.jet(x, cos, sin, j), x0)


def test_feed_forward_and_block_rules():
    model = Llama(MODEL)
    x0 = _randn(2, 5, 8, seed=4)
    _check_module_jet(model.layers[0].feed_forward, lambda m, x, j: m.jet(x, j), x0)
    cos, sin = rope_tables(5, MODEL, torch.device("cpu"))
    block = model.layers[1].double()
    _check_module_jet(_WithRope(block, cos, sin), lambda m, x, j: block.jet(x, cos, sin, j), x0, seed=7)


def test_matmul_helpers():
    x, V = _randn(2, 3, 4, seed=30), _randn(K, 5, 4, seed=31)
    torch.testing.assert_close(per_direction(x, V), torch.stack([x @ v.T for v in V]), rtol=0, atol=1e-14)
    A, X = _randn(2, 3, 4, seed=32), _randn(K, 2, 4, 6, seed=33)
    torch.testing.assert_close(shared_matmul(A, X), torch.stack([A @ x for x in X]), rtol=0, atol=1e-14)
    a, b, s = _randn(K, 2, 3, seed=34), _randn(K, 2, 3, seed=35), _randn(2, 3, seed=36)
    torch.testing.assert_close(per_direction_dot(a, b), (a * b).sum((1, 2)), rtol=0, atol=1e-14)
    torch.testing.assert_close(per_direction_dot(a, s), (a * s).sum((1, 2)), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="do not pair"):
        per_direction_dot(a, _randn(4, seed=37))


@pytest.mark.parametrize("tie", [True, False])
def test_whole_model_jet_is_the_second_directional_derivative(tie):
    """Llama.jet + loss_jet in Taylor mode = d²/dt² of the summed loss along θ + t v (torch.func),
    with ignored targets, tied and untied output head."""
    config = ModelConfig(**{**MODEL.__dict__, "tie_embeddings": tie})
    torch.manual_seed(0)
    check_whole_model_jet(Llama(config).double())


def test_every_layer_type_has_a_rule_and_others_are_refused():
    model = Llama(MODEL, attention_backend="reference").double()
    check_jet_rules(model)  # every layer type of the model, tied or not
    check_jet_rules(Llama(ModelConfig(**{**MODEL.__dict__, "tie_embeddings": False})))
    tokens = torch.randint(0, 16, (3, 5), generator=_gen(50))
    model.layers[0].dropout = nn.Dropout(0.0)  # a layer the rules do not know
    for engine in FORM_ENGINES:
        with pytest.raises(ValueError, match=r"layer layers.0.dropout \(Dropout\) has no second-order rule"):
            EpochHessian(model, tokens, batch_size=2, engine=engine, precision=CPU64)
    EpochHessian(model, tokens, batch_size=2, engine="double_backward", precision=CPU64)  # HVP engines need no rules
    del model.layers[0].dropout
    model.layers[0].feed_forward.act = nn.GELU()  # a module without a jet method
    with pytest.raises(ValueError, match=r"layer layers.0.feed_forward.act \(GELU\) has no second-order rule"):
        EpochHessian(model, tokens, batch_size=2, engine="taylor", precision=CPU64)
    with pytest.raises(ValueError, match="need reference attention"):
        check_jet_rules(Llama(MODEL, attention_backend="sdpa"))


def test_hvp_of_a_quadratic_form_engine_is_refused():
    model = Llama(MODEL).double()
    op = EpochHessian(model, torch.randint(0, 16, (3, 5)), batch_size=2, engine="adjoint", precision=CPU64)
    with pytest.raises(ValueError, match="computes quadratic forms vᵀHv only"):
        op.hvp(torch.zeros(1, op.flat.D, dtype=torch.float64))
    assert math.isfinite(float(op.quadratic_forms(torch.ones(1, op.flat.D, dtype=torch.float64))[0]))


NEW_LAYERS = {
    "llama-gqa-biases-llama3": ModelConfig(
        **{
            **MODEL.__dict__,
            "n_heads": 4,
            "n_kv_heads": 2,
            "attention_bias": "all",
            "mlp_bias": True,
            "rope_scaling": RopeScaling(kind="llama3", factor=4.0, original_max_seq_len=4),
        }
    ),
    "qwen2-style": ModelConfig(**{**MODEL.__dict__, "n_kv_heads": 1, "attention_bias": "qkv"}),
    "gpt_neox-partial-rotary": ModelConfig(**{**MODEL.__dict__, "architecture": "gpt_neox", "rotary_pct": 0.5}),
    "gpt_neox-sequential": ModelConfig(**{**MODEL.__dict__, "architecture": "gpt_neox", "parallel_residual": False}),
}


@pytest.mark.parametrize("variant", list(NEW_LAYERS))
def test_grouped_query_biased_scaled_and_partial_rotary_attention_and_blocks(variant):
    """Grouped-query heads, biases, RoPE scaling, GPT-NeoX's partial rotation of its head-interleaved
    q/k/v and both residual forms: each attention and each block against jvp of jvp."""
    config = NEW_LAYERS[variant]
    torch.manual_seed(1)
    model = build_model(config).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    cos, sin = rope_tables(5, config, torch.device("cpu"))
    x0 = _randn(2, 5, 8, seed=40)
    attention, block = model.layers[0].attention, model.layers[1]
    _check_module_jet(_WithRope(attention, cos, sin), lambda m, x, j: attention.jet(x, cos, sin, j), x0, seed=41)
    _check_module_jet(_WithRope(block, cos, sin), lambda m, x, j: block.jet(x, cos, sin, j), x0, seed=42)
