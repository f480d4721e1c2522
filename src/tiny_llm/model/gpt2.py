"""The GPT-2 causal language model, as Hugging Face's ``GPT2LMHeadModel`` computes it: learned
positions, pre-norm LayerNorm with bias, causal attention with biased projections, a GELU MLP
(tanh approximation), a final LayerNorm and an output head tied to the token embedding (or not).
Each layer's second-order jet rule is beside it, as for the Llama."""

from __future__ import annotations

import math

import torch
from torch import nn

from tiny_llm.config import ModelConfig
from tiny_llm.model.causal import AttentionBackend, CausalLM
from tiny_llm.model.jets import Jet, JetPass, elementwise_jet
from tiny_llm.model.layers import (
    LayerNorm,
    causal_attention,
    embedding_jet,
    linear_jet,
    reference_attention_jet,
)

__all__ = ["GPT2", "gelu", "gelu_jet"]

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation, ½x(1 + tanh(c(x + a x³))), c = √(2/π), a = 0.044715 (GPT-2's
    ``gelu_new``), from elementary ops so that every derivative path (double backward, forward over
    reverse, vmap) has its rules."""
    return 0.5 * x * (1.0 + torch.tanh(_GELU_C * (x + _GELU_A * x.pow(3))))


def gelu_derivatives(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """g′ and g″ of ``gelu``: with u = c(x + a x³), t = tanh u, u′ = c(1 + 3a x²), u″ = 6ca x:
    g′ = ½(1 + t) + ½x(1 − t²)u′ and g″ = (1 − t²)(u′ + ½x(u″ − 2t u′²))."""
    t = torch.tanh(_GELU_C * (x + _GELU_A * x.pow(3)))
    du, d2u = _GELU_C * (1 + 3 * _GELU_A * x.square()), 6 * _GELU_C * _GELU_A * x
    sech2 = 1 - t.square()
    return 0.5 * (1 + t) + 0.5 * x * sech2 * du, sech2 * (du + 0.5 * x * (d2u - 2 * t * du.square()))


def gelu_jet(a: Jet) -> Jet:
    """gelu(a): y1 = g′a1, y2 = g′a2 + g″a1²."""
    return elementwise_jet(a, gelu, gelu_derivatives)


class GPT2Attention(nn.Module):
    """Causal multi-head self-attention: one biased projection to q, k and v, one biased output
    projection, no positional rotation (positions enter through the embedding)."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.n_heads, self.head_dim, self.backend = config.n_heads, config.head_dim, backend
        C = config.d_model
        self.wqkv = nn.Linear(C, 3 * C)
        self.wo = nn.Linear(C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (z.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for z in self.wqkv(x).split(C, dim=-1))
        y = causal_attention(q, k, v, self.backend)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))

    def jet(self, x: Jet, jets: JetPass) -> Jet:
        """The projection's rule, a split into heads (linear), the attention core's, the output projection's."""
        B, T, C = x.z0.shape

        def heads(part: int):  # (..., B, T, 3C) -> (..., B, nh, T, hs), the part-th third
            return lambda z: (
                z[..., part * C : (part + 1) * C].unflatten(-1, (self.n_heads, self.head_dim)).transpose(-3, -2)
            )

        def merge(z: torch.Tensor) -> torch.Tensor:  # (..., B, nh, T, hs) -> (..., B, T, C)
            return z.transpose(-3, -2).reshape(*z.shape[:-4], B, T, C)

        qkv = linear_jet(x, self.wqkv, jets)
        q, k, v = (qkv.map(heads(part)) for part in range(3))
        y = reference_attention_jet(q, k, v, jets, key=self).map(merge)
        return linear_jet(y, self.wo, jets)


class GPT2MLP(nn.Module):
    """w2(gelu(w1 x)), both projections biased (``bias``); a subclass names another GELU and its rule."""

    activation = staticmethod(gelu)
    activation_jet = staticmethod(gelu_jet)

    def __init__(self, config: ModelConfig, bias: bool = True):
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff, bias=bias)
        self.w2 = nn.Linear(config.d_ff, config.d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.activation(self.w1(x)))

    def jet(self, x: Jet, jets: JetPass) -> Jet:
        """w1's rule, GELU's (its own term g″a1² a generic node, absorbed in the adjoint mode), w2's."""
        hidden = jets.emit((self, "gelu"), self.activation_jet(linear_jet(x, self.w1, jets)))
        return linear_jet(hidden, self.w2, jets)


class GPT2Block(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.attention_norm = LayerNorm(config.d_model, config.norm_eps)
        self.attention = GPT2Attention(config, backend)
        self.ffn_norm = LayerNorm(config.d_model, config.norm_eps)
        self.feed_forward = GPT2MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))

    def jet(self, x: Jet, jets: JetPass) -> Jet:
        x = x + self.attention.jet(self.attention_norm.jet(x, jets), jets)
        return x + self.feed_forward.jet(self.ffn_norm.jet(x, jets), jets)


class GPT2(CausalLM):
    """GPT-2 decoder. ``forward(idx)`` maps token ids (B, T) to logits (B, T, vocab).

    Args:
        config: the model shape (``RunConfig.model`` with ``architecture: gpt2``).
        attention_backend: ``"reference"`` (explicit matmul + softmax, supports second derivatives;
            what analysis uses) or ``"sdpa"`` (fused ``scaled_dot_product_attention``, for training).

    Example:
        >>> model = GPT2(ModelConfig(architecture="gpt2", d_model=16, n_heads=2, d_ff=64))
        >>> model(torch.tensor([[1, 4, 8]])).shape
        torch.Size([1, 3, 256])
    """

    def __init__(self, config: ModelConfig, attention_backend: AttentionBackend = "reference"):
        super().__init__()
        self._begin(config, attention_backend)
        self.pos_embeddings = nn.Embedding(config.max_seq_len, config.d_model)
        self.layers = nn.ModuleList(GPT2Block(config, attention_backend) for _ in range(config.n_layers))
        self.norm = LayerNorm(config.d_model, config.norm_eps)
        self._end()

    def _positions(self, T: int, device: torch.device) -> torch.Tensor:
        return torch.arange(T, device=device).unsqueeze(0)  # (1, T): broadcasts over the batch

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final normalised hidden state (B, T, C) of token ids (B, T)."""
        self._check_length(idx.size(1))
        x = self.tok_embeddings(idx) + self.pos_embeddings(self._positions(idx.size(1), idx.device))
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def jet(self, idx: torch.Tensor, jets: JetPass) -> Jet:
        """The jet of the final normalised hidden state (B, T, C) along the directions of ``jets``."""
        self._check_jet_backend()
        self._check_length(idx.size(1))
        x = embedding_jet(idx, self.tok_embeddings, jets) + embedding_jet(
            self._positions(idx.size(1), idx.device), self.pos_embeddings, jets
        )
        if jets.recorded is not None and not x.z0.requires_grad:  # the record pass needs a graph
            x = Jet(x.z0.detach().requires_grad_(), x.z1)
        for layer in self.layers:
            x = layer.jet(x, jets)
        return self.norm.jet(x, jets)
