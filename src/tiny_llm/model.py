"""The Llama-style causal language model (RMSNorm, RoPE, causal attention, SwiGLU, tied embedding)."""

from __future__ import annotations

import contextlib
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from tiny_llm.config import ModelConfig

__all__ = ["IGNORE_INDEX", "Llama", "count_parameters", "token_losses"]

IGNORE_INDEX = -100
"""Target id of padded positions: they contribute zero loss and no gradient."""

AttentionBackend = Literal["reference", "sdpa"]


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """At least float32: reductions (norms, softmax, cross-entropy) never run in bf16/fp16."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _without_autocast(x: torch.Tensor) -> contextlib.AbstractContextManager:
    """Disable autocast for the device of ``x`` (keeps explicit fp32 regions fp32 under --amp)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU written as x * sigmoid(x).

    ``aten::silu_backward`` has no forward-mode rule; ``F.silu`` only survives forward-over-reverse
    because autograd swaps in a composite backward under ``create_graph`` and ``torch.func`` keeps
    a (deprecated) TorchScript decomposition. Built from mul and sigmoid, every op has its own
    forward-mode and double-backward rules, whatever path (eager, vmap, compile) computes the HVP.
    """
    return x * torch.sigmoid(x)


def rope_tables(T: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, shape (T, head_dim // 2), computed in float64."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.outer(torch.arange(T, dtype=torch.float64, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head's features: x (B, nh, T, hs) -> (B, nh, T, hs)."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, with the mean square reduced in at least float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _without_autocast(x):
            xf = _upcast(x)
            normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Explicit causal softmax(q kᵀ / √hs) v; twice differentiable, scores in at least float32."""
    T, hs = q.size(-2), q.size(-1)
    with _without_autocast(q):
        scores = _upcast(q) @ _upcast(k).transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return probs.to(v.dtype) @ v


class Attention(nn.Module):
    """Causal multi-head self-attention with rotary positions."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.n_heads, self.head_dim, self.backend = config.n_heads, config.head_dim, backend
        C = config.d_model
        self.wq = nn.Linear(C, C, bias=False)
        self.wk = nn.Linear(C, C, bias=False)
        self.wv = nn.Linear(C, C, bias=False)
        self.wo = nn.Linear(C, C, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (w(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
                   for w in (self.wq, self.wk, self.wv))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.backend == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = reference_attention(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.w2 = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.w3 = nn.Linear(config.d_model, config.d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: attention then feed-forward."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attention = Attention(config, backend)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Llama-style decoder. ``forward(idx)`` maps token ids (B, T) to logits (B, T, vocab).

    Args:
        config: the model shape (``RunConfig.model``).
        attention_backend: ``"reference"`` (explicit matmul + softmax, supports second derivatives;
            what analysis uses) or ``"sdpa"`` (fused ``scaled_dot_product_attention``, for training).

    Example:
        >>> model = Llama(ModelConfig(d_model=16, n_heads=2, d_ff=32), attention_backend="reference")
        >>> model(torch.tensor([[1, 4, 8]])).shape
        torch.Size([1, 3, 256])
    """

    def __init__(self, config: ModelConfig, attention_backend: AttentionBackend = "reference"):
        super().__init__()
        if attention_backend not in ("reference", "sdpa"):
            raise ValueError(f"attention_backend: expected 'reference' or 'sdpa', got {attention_backend!r}")
        self.config, self.attention_backend = config, attention_backend
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(TransformerBlock(config, attention_backend) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        # Tied: logits use tok_embeddings.weight directly, so the state dict holds the tensor once.
        self.output = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/√(2 n_layers)."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layers))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds model.max_seq_len={self.config.max_seq_len}")
        cos, sin = rope_tables(T, self.config.head_dim, self.config.rope_theta, idx.device)
        x = self.tok_embeddings(idx)  # (B, T, C)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        weight = self.tok_embeddings.weight if self.output is None else self.output.weight
        return F.linear(x, weight)  # (B, T, vocab)


def token_losses(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Per-token cross-entropy (B, T) in at least float32; ignored targets give exactly 0.

    Example:
        >>> token_losses(torch.zeros(1, 2, 4), torch.tensor([[3, IGNORE_INDEX]]))
        tensor([[1.3863, 0.0000]])
    """
    with _without_autocast(logits):
        flat = _upcast(logits).flatten(0, -2)
        losses = F.cross_entropy(flat, targets.flatten(), reduction="none", ignore_index=ignore_index)
    return losses.view(targets.shape)


def count_parameters(model: nn.Module) -> int:
    """D: unique trainable parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
