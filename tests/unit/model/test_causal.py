"""What every causal language model shares: the per-token loss with ignored targets, the
precision of reductions, the row-chunked inner products of the loss's rule, the jet-rule check and
the parameter count."""

import pytest
import torch
import torch.nn.functional as F

import tiny_llm.model.causal as causal
from tiny_llm.config import ModelConfig
from tiny_llm.model.causal import (
    IGNORE_INDEX,
    check_jet_rules,
    count_parameters,
    row_dots,
    token_losses,
    upcast,
)
from tiny_llm.model.llama import Llama

CONFIG = ModelConfig(vocab_size=32, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_seq_len=8)


def test_token_losses_are_cross_entropy_with_ignored_targets_exactly_zero():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64)
    targets = torch.randint(0, 11, (2, 5))
    targets[1, 2:] = IGNORE_INDEX
    losses = token_losses(logits, targets)
    expected = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
    assert losses.shape == (2, 5) and torch.allclose(losses, expected, rtol=0, atol=1e-15)
    assert (losses[1, 2:] == 0).all()
    assert token_losses(logits.to(torch.bfloat16), targets).dtype == torch.float32  # never reduced in bf16
    assert upcast(torch.ones(1, dtype=torch.float16)).dtype == torch.float32
    assert upcast(torch.ones(1, dtype=torch.float64)).dtype == torch.float64


def test_row_dots_in_chunks_equal_the_whole_contraction(monkeypatch):
    torch.manual_seed(1)
    z, p = torch.randn(3, 7, 5, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    whole = torch.einsum("knv,nv->kn", z, p)
    assert torch.allclose(row_dots(z, p), whole, rtol=0, atol=1e-14)
    monkeypatch.setattr(causal, "ROW_DOT_ELEMENTS", 16)  # one row of 3 × 5 products at a time
    assert torch.allclose(row_dots(z, p), whole, rtol=0, atol=1e-14)


def test_a_layer_without_a_jet_rule_is_refused_by_name():
    model = Llama(CONFIG, attention_backend="reference")
    check_jet_rules(model)  # every layer has its rule
    model.layers[0].feed_forward.extra = torch.nn.GELU()  # a layer added without one
    with pytest.raises(ValueError, match=r"layer layers.0.feed_forward.extra \(GELU\) has no second-order rule"):
        check_jet_rules(model)


def test_a_tied_embedding_counts_once():
    tied, untied = Llama(CONFIG), Llama(ModelConfig(**{**CONFIG.__dict__, "tie_embeddings": False}))
    assert count_parameters(untied) - count_parameters(tied) == CONFIG.vocab_size * CONFIG.d_model
    assert count_parameters(tied) == sum(p.numel() for p in {id(p): p for p in tied.parameters()}.values())
