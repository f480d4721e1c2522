"""The Llama-family causal language model (RMSNorm, RoPE with optional frequency scaling, causal
attention with grouped-query heads and optional q/k/v(/o) biases, SwiGLU, tied or untied head: the
layout of Llama 2/3, Mistral and Qwen2 checkpoints), each layer with its second-order jet rule
beside it. The base class, the loss and the rules other
architectures share are in :mod:`tiny_llm.model.causal` and :mod:`tiny_llm.model.layers`."""

from __future__ import annotations

import torch
from torch import nn

from tiny_llm.config import ModelConfig
from tiny_llm.model.causal import (
    IGNORE_INDEX,
    AttentionBackend,
    CausalLM,
    check_jet_rules,
    count_parameters,
    token_losses,
    upcast,
    without_autocast,
)
from tiny_llm.model.jets import Jet, JetPass, elementwise_jet, per_direction_dot
from tiny_llm.model.layers import (
    RotaryDecoder,
    apply_rope,
    causal_attention,
    feature_jet,
    linear_jet,
    reference_attention_jet,
    repeat_kv,
    rms_normalize_jet,
    rope_tables,
)

__all__ = [
    "IGNORE_INDEX",
    "CausalLM",
    "Llama",
    "apply_rope",
    "check_jet_rules",
    "count_parameters",
    "rope_tables",
    "token_losses",
]


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU written as x * sigmoid(x).

    ``aten::silu_backward`` has no forward-mode rule; ``F.silu`` only survives forward-over-reverse
    because autograd swaps in a composite backward under ``create_graph`` and ``torch.func`` keeps
    a (deprecated) TorchScript decomposition. Built from mul and sigmoid, every op has its own
    forward-mode and double-backward rules, whatever path (eager, vmap, compile) computes the HVP.
    """
    return x * torch.sigmoid(x)


def silu_derivatives(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s′ = σ(1 + a(1−σ)) and s″ = σ(1−σ)(2 + a(1−2σ)) of silu(a) = a·σ(a)."""
    sigma = torch.sigmoid(a)
    return sigma * (1 + a * (1 - sigma)), sigma * (1 - sigma) * (2 + a * (1 - 2 * sigma))


def silu_jet(a: Jet) -> Jet:
    """silu(a): y1 = s′a1, y2 = s′a2 + s″a1²."""
    return elementwise_jet(a, silu, silu_derivatives)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, with the mean square reduced in at least float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with without_autocast(x):
            xf = upcast(x)
            normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight

    def jet(self, x: Jet, jets: JetPass) -> Jet:
        """n = (x / rms(x))·w: the normalisation's rule, then the product rule with w(t) = w + t·w_v;
        in the adjoint mode fused (``_adjoint_jet``)."""
        lam = jets.adjoint(self, x)
        if lam is not None:
            return self._adjoint_jet(x, lam, jets)
        return jets.emit(self, jets.product(rms_normalize_jet(x, self.eps, jets), feature_jet(self.weight, jets, x)))

    def _adjoint_jet(self, x: Jet, lam: torch.Tensor, jets: JetPass) -> Jet:
        """The adjoint mode (no input z2): with r = m^(−½) as in ``rms_normalize_jet``, the output's
        z1 = (x1 r0 + x0 r1) w + x0 r0 w_v, and its own second-order term
        Q = (2 x1 r1 + x0 r2) w + 2 (x1 r0 + x0 r1) w_v is contracted with λ term by term,
        ⟨λ, Q⟩ = 2Σ r1⟨λw, x1⟩_row + Σ r2⟨λw, x0⟩_row + 2⟨r0 λ w_v, x1⟩ + 2Σ r1⟨λ x0, w_v⟩_row,
        so that no (K, tokens, C) tensor but z1 and two row reductions is written (the generic
        product rules wrote about twenty)."""
        with without_autocast(x.z0):
            x0, x1 = upcast(x.z0), upcast(x.z1)  # (..., C), (K, ..., C)
            K, C = x1.size(0), x0.size(-1)
            w, lam = self.weight.to(x0.dtype), upcast(lam)
            wv = jets.direction(self.weight).to(x0.dtype).view(K, *([1] * (x0.dim() - 1)), C)
            r0 = torch.rsqrt(x0.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., 1)
            lam_w, u = lam * w, wv.reshape(K, C)
            # ⟨x1, x0⟩ and ⟨x1, λw⟩ by row in one batched product over the tokens (half the time of two
            # products and sums): (tokens, K, C) @ (tokens, C, 2) -> (K, ..., 2)
            N = x0.numel() // C
            pair = torch.stack([x0, lam_w], dim=-1).reshape(N, C, 2)
            dots = torch.bmm(x1.reshape(K, N, C).transpose(0, 1), pair).transpose(0, 1).reshape(*x1.shape[:-1], 2)
            m1, rows = dots[..., :1] * (2 / C), dots[..., 1:]  # (K, ..., 1): 2⟨x0, x1⟩/C and ⟨λw, x1⟩
            m2 = torch.linalg.vector_norm(x1, dim=-1, keepdim=True).square_().mul_(2 / C)
            r1 = -0.5 * r0.pow(3) * m1
            r2 = -0.5 * r0.pow(3) * m2 + 0.75 * r0.pow(5) * m1.square()
            every, tokens = tuple(range(1, x1.dim())), tuple(range(1, x1.dim() - 1))
            forms = (  # each term's last sum in float64 (the terms cancel); the long ones are per row or feature
                2 * (r1 * rows).double().sum(every)  # 2Σ r1⟨λw, x1⟩
                + (r2 * (lam_w * x0).sum(-1, keepdim=True)).double().sum(every)  # Σ r2⟨λw, x0⟩
                + 2 * ((x1 * (r0 * lam)).sum(tokens).reshape(K, C) * u).double().sum(-1)  # 2⟨r0 λ w_v, x1⟩
                + 2 * (r1.reshape(K, -1) * (u @ (lam * x0).reshape(-1, C).t())).double().sum(-1)  # 2Σ r1⟨λ x0, w_v⟩
            )
            jets.absorb(forms)
            z1 = torch.mul(x1, r0 * w).addcmul_(x0 * w, r1).addcmul_(x0 * r0, wv)
            return Jet((x0 * r0).to(x.z0.dtype) * self.weight, z1.to(x.z1.dtype))


class Attention(nn.Module):
    """Causal self-attention with rotary positions: n_heads query heads, each group of
    n_heads / kv_heads of them sharing one key/value head (grouped-query attention; multi-head when
    equal); q, k, v biased for attention_bias qkv or all, the output projection for all."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend):
        super().__init__()
        self.n_heads, self.head_dim, self.backend = config.n_heads, config.head_dim, backend
        self.groups = config.n_heads // config.kv_heads
        C, kv_width, biases = config.d_model, config.kv_heads * config.head_dim, config.attention_biases
        self.wq = nn.Linear(C, C, bias=biases != "none")
        self.wk = nn.Linear(C, kv_width, bias=biases != "none")
        self.wv = nn.Linear(C, kv_width, bias=biases != "none")
        self.wo = nn.Linear(C, C, bias=biases == "all")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            w(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, heads, T, hs)
            for w in (self.wq, self.wk, self.wv)
        )
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = repeat_kv(k, self.groups), repeat_kv(v, self.groups)
        y = causal_attention(q, k, v, self.backend)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))

    def jet(self, x: Jet, cos: torch.Tensor, sin: torch.Tensor, jets: JetPass) -> Jet:
        """Linear projections, then RoPE and the key/value heads' repetition (both linear: every
        coefficient alike), the attention core's jet, the output projection."""
        B, T, C = x.z0.shape

        def heads(z: torch.Tensor) -> torch.Tensor:  # (..., B, T, h·hs) -> (..., B, h, T, hs)
            return z.unflatten(-1, (-1, self.head_dim)).transpose(-3, -2)

        def merge(z: torch.Tensor) -> torch.Tensor:  # (..., B, nh, T, hs) -> (..., B, T, C)
            return z.transpose(-3, -2).reshape(*z.shape[:-4], B, T, C)

        q, k, v = (linear_jet(x, w, jets).map(heads) for w in (self.wq, self.wk, self.wv))
        q, k = (z.map(lambda t: apply_rope(t, cos, sin)) for z in (q, k))
        k, v = (z.map(lambda t: repeat_kv(t, self.groups)) for z in (k, v))
        y = reference_attention_jet(q, k, v, jets, key=self).map(merge)
        return linear_jet(y, self.wo, jets)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        bias = config.mlp_biased
        self.w1 = nn.Linear(config.d_model, config.d_ff, bias=bias)
        self.w2 = nn.Linear(config.d_ff, config.d_model, bias=bias)
        self.w3 = nn.Linear(config.d_model, config.d_ff, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu(self.w1(x)) * self.w3(x))

    def jet(self, x: Jet, jets: JetPass) -> Jet:
        """Gate g = silu(a)·b with a = w1x, b = w3x (product and silu rules), then w2. In the adjoint
        mode the gate's own term s″a1²b0 + 2s′a1b1 is contracted with its λ without forming it."""
        a, b = linear_jet(x, self.w1, jets), linear_jet(x, self.w3, jets)
        lam = jets.adjoint((self, "gate"), a, b)
        if lam is None:
            gate = jets.product(silu_jet(a), b, key=(self, "gate"))
        else:
            d1, d2 = silu_derivatives(a.z0)
            t = torch.mul(a.z1, lam * d2 * b.z0, out=jets.buffer("gate t", a.z1.shape, a.z1))
            own = t.addcmul_(b.z1, lam * d1, value=2)  # λ(s″a1b0 + 2s′b1), then ⟨·, a1⟩
            jets.absorb(per_direction_dot(own, a.z1, overwrite=True))  # ⟨λ, s″a1²b0 + 2s′a1b1⟩
            gate = Jet(silu(a.z0) * b.z0, torch.mul(a.z1, d1 * b.z0).addcmul_(b.z1, silu(a.z0)))
        return linear_jet(gate, self.w2, jets)


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

    def jet(self, x: Jet, cos: torch.Tensor, sin: torch.Tensor, jets: JetPass) -> Jet:
        x = x + self.attention.jet(self.attention_norm.jet(x, jets), cos, sin, jets)
        return x + self.feed_forward.jet(self.ffn_norm.jet(x, jets), jets)


class Llama(RotaryDecoder):
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

    block = TransformerBlock
    final_norm = RMSNorm
