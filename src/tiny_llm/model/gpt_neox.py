"""The GPT-NeoX causal language model (the Pythia suites), as Hugging Face's ``GPTNeoXForCausalLM``
computes it: LayerNorm with bias, one fused q/k/v projection in GPT-NeoX's head-interleaved layout,
RoPE on the first ``rotary_pct`` of each head's features, exact (erf) GELU, a parallel residual
(attention and MLP both read the block's input) or a sequential one, a final LayerNorm and an
untied head. Each layer's second-order jet rule is beside it, as for the Llama."""

from __future__ import annotations

import math

import torch
from torch import nn

from tiny_llm.config import ModelConfig
from tiny_llm.model.causal import AttentionBackend
from tiny_llm.model.gpt2 import GPT2MLP
from tiny_llm.model.jets import Jet, JetPass, elementwise_jet
from tiny_llm.model.layers import (
    LayerNorm,
    RotaryDecoder,
    apply_rope,
    causal_attention,
    linear_jet,
    reference_attention_jet,
)

__all__ = ["GPTNeoX", "gelu_exact", "gelu_exact_jet"]

_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


def gelu_exact(x: torch.Tensor) -> torch.Tensor:
    """GELU x·Φ(x) = ½x(1 + erf(x/√2)) (``F.gelu``'s default, GPT-NeoX's ``hidden_act: gelu``), from
    elementary ops so that every derivative path has its rules."""
    return 0.5 * x * (1.0 + torch.erf(x * _SQRT_HALF))


def gelu_exact_derivatives(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """g′ = Φ(x) + xφ(x) and g″ = φ(x)(2 − x²) of g(x) = xΦ(x), φ the standard normal density."""
    phi = _INV_SQRT_2PI * torch.exp(-0.5 * x.square())
    return 0.5 * (1.0 + torch.erf(x * _SQRT_HALF)) + x * phi, phi * (2 - x.square())


def gelu_exact_jet(a: Jet) -> Jet:
    """gelu_exact(a): y1 = g′a1, y2 = g′a2 + g″a1²."""
    return elementwise_jet(a, gelu_exact, gelu_exact_derivatives)


class GPTNeoXAttention(nn.Module):
    """Causal multi-head self-attention with partial rotary positions. ``wqkv`` is GPT-NeoX's
    ``query_key_value``: its output features are grouped by head, each head's q, k and v side by
    side, (nh, 3, hs) — not q, k, v one after the other as in GPT-2."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.n_heads, self.head_dim, self.backend = config.n_heads, config.head_dim, backend
        C, biased = config.d_model, config.attention_biases == "all"
        self.wqkv = nn.Linear(C, 3 * C, bias=biased)
        self.wo = nn.Linear(C, C, bias=biased)

    def _split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(..., B, T, 3C) -> q, k, v, each (..., B, nh, T, hs), from the head-interleaved layout."""
        heads = qkv.unflatten(-1, (self.n_heads, 3 * self.head_dim)).transpose(-3, -2)
        return heads.split(self.head_dim, dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self._split(self.wqkv(x))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = causal_attention(q, k, v, self.backend)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))

    def jet(self, x: Jet, cos: torch.Tensor, sin: torch.Tensor, jets: JetPass) -> Jet:
        """The fused projection's rule, the split into heads and the partial rotation (linear: every
        coefficient alike), the attention core's jet, the output projection's."""
        B, T, C = x.z0.shape
        qkv = linear_jet(x, self.wqkv, jets)
        parts = [self._split(z) if z is not None else (None, None, None) for z in (qkv.z0, qkv.z1, qkv.z2)]
        q, k, v = (Jet(*(p[i] for p in parts)) for i in range(3))
        q, k = (z.map(lambda t: apply_rope(t, cos, sin)) for z in (q, k))
        y = reference_attention_jet(q, k, v, jets, key=self).map(
            lambda z: z.transpose(-3, -2).reshape(*z.shape[:-4], B, T, C)
        )
        return linear_jet(y, self.wo, jets)


class GPTNeoXMLP(GPT2MLP):
    """w2(gelu_exact(w1 x)), both projections biased unless mlp_bias is false."""

    activation = staticmethod(gelu_exact)
    activation_jet = staticmethod(gelu_exact_jet)

    def __init__(self, config: ModelConfig):
        super().__init__(config, bias=config.mlp_biased)


class GPTNeoXBlock(nn.Module):
    """Parallel residual x + attention(norm₁ x) + mlp(norm₂ x), or sequential (norm₂ of x + attention)."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.parallel = config.parallel_residual
        # Registered in Hugging Face's order, so that the flat parameter vector (and every seeded
        # direction drawn over it) is the adapter's too.
        self.attention_norm = LayerNorm(config.d_model, config.norm_eps)
        self.ffn_norm = LayerNorm(config.d_model, config.norm_eps)
        self.attention = GPTNeoXAttention(config, backend)
        self.feed_forward = GPTNeoXMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        attended = x + self.attention(self.attention_norm(x), cos, sin)
        return attended + self.feed_forward(self.ffn_norm(x if self.parallel else attended))

    def jet(self, x: Jet, cos: torch.Tensor, sin: torch.Tensor, jets: JetPass) -> Jet:
        attended = x + self.attention.jet(self.attention_norm.jet(x, jets), cos, sin, jets)
        return attended + self.feed_forward.jet(self.ffn_norm.jet(x if self.parallel else attended, jets), jets)


class GPTNeoX(RotaryDecoder):
    """GPT-NeoX decoder (Pythia). ``forward(idx)`` maps token ids (B, T) to logits (B, T, vocab).

    Args:
        config: the model shape (``RunConfig.model`` with ``architecture: gpt_neox``).
        attention_backend: ``"reference"`` (explicit matmul + softmax, supports second derivatives;
            what analysis uses) or ``"sdpa"`` (fused ``scaled_dot_product_attention``, for training).

    Example:
        >>> config = ModelConfig(architecture="gpt_neox", d_model=16, n_heads=2, d_ff=64, rotary_pct=0.25)
        >>> GPTNeoX(config)(torch.tensor([[1, 4, 8]])).shape
        torch.Size([1, 3, 256])
    """

    block = GPTNeoXBlock
    final_norm = LayerNorm
