"""The Llama-style causal language model (RMSNorm, RoPE, causal attention, SwiGLU, tied embedding)."""

from __future__ import annotations

import contextlib
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from tiny_llm.config import ModelConfig
from tiny_llm.model.jets import Jet, JetPass, add_terms, per_direction, per_direction_dot, shared_matmul

__all__ = ["IGNORE_INDEX", "CausalLM", "Llama", "check_jet_rules", "count_parameters", "token_losses"]

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


def linear_jet(x: Jet, linear: nn.Linear, jets: JetPass) -> Jet:
    """y = x Wᵀ + b with W(t) = W + tV, b(t) = b + tβ: y1 = x1Wᵀ + x0Vᵀ + β, y2 = x2Wᵀ + 2x1Vᵀ
    (the bias is linear in t; own term 2x1Vᵀ, contracted as 2⟨λV, x1⟩ in the adjoint mode)."""
    W, V = linear.weight, jets.direction(linear.weight)  # (out, in), (K, out, in)
    y0, y1 = F.linear(x.z0, W, linear.bias), per_direction(x.z0, V, out=F.linear(x.z1, W))
    if linear.bias is not None:
        beta = jets.direction(linear.bias)  # (K, out), broadcast over the leading axes of x
        y1 = y1.add_(beta.view(beta.size(0), *([1] * (x.z0.dim() - 1)), beta.size(-1)).to(y1.dtype))
    lam = jets.adjoint(linear, x)
    K, m, n = V.shape
    if lam is not None:
        lam_v = per_direction(lam, V.transpose(1, 2), buffer=jets.buffer("linear λV", (K, lam.numel() // m, n), V))
        jets.absorb(2 * per_direction_dot(lam_v, x.z1))  # 2⟨λV, x1⟩
        return Jet(y0, y1)
    y2 = 2 * torch.bmm(x.z1.reshape(K, x.z0.numel() // n, n), V.transpose(1, 2)).view(y1.shape)
    return jets.emit(linear, Jet(y0, y1, y2 if x.z2 is None else y2 + F.linear(x.z2, W)))


def embedding_jet(idx: torch.Tensor, embedding: nn.Embedding, jets: JetPass) -> Jet:
    """Lookup E[idx] with E(t) = E + tU: linear in E, so e1 = U[idx] and e2 = 0."""
    return Jet(embedding(idx), jets.direction(embedding.weight)[:, idx])


def silu_derivatives(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s′ = σ(1 + a(1−σ)) and s″ = σ(1−σ)(2 + a(1−2σ)) of silu(a) = a·σ(a)."""
    sigma = torch.sigmoid(a)
    return sigma * (1 + a * (1 - sigma)), sigma * (1 - sigma) * (2 + a * (1 - 2 * sigma))


def silu_jet(a: Jet) -> Jet:
    """silu(a): y1 = s′a1, y2 = s′a2 + s″a1²."""
    d1, d2 = silu_derivatives(a.z0)
    return Jet(silu(a.z0), d1 * a.z1, add_terms(d2 * a.z1.square(), None if a.z2 is None else d1 * a.z2))


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

    def jet(self, x: Jet, jets: JetPass) -> Jet:
        """n = (x / rms(x))·w: the normalisation's rule, then the product rule with w(t) = w + t·w_v."""
        return jets.emit(self, jets.product(rms_normalize_jet(x, self.eps, jets), feature_jet(self.weight, jets, x)))


def rms_normalize_jet(x: Jet, eps: float, jets: JetPass) -> Jet:
    """x·r with r = m^(−½), m = mean(x²) + ε, reduced in at least float32: m1 = 2⟨x0, x1⟩/C,
    m2 = 2(⟨x1, x1⟩ + ⟨x0, x2⟩)/C, r1 = −½m^(−3/2)m1, r2 = −½m^(−3/2)m2 + ¾m^(−5/2)m1², then the
    product rule."""
    with _without_autocast(x.z0):
        xf = x.map(_upcast)
        m0 = xf.z0.pow(2).mean(-1, keepdim=True) + eps
        m1 = 2 * (xf.z0 * xf.z1).mean(-1, keepdim=True)
        m2 = 2 * xf.z1.pow(2).mean(-1, keepdim=True)
        if xf.z2 is not None:
            m2 = m2 + 2 * (xf.z0 * xf.z2).mean(-1, keepdim=True)
        r0 = torch.rsqrt(m0)
        r1 = -0.5 * r0.pow(3) * m1
        r2 = -0.5 * r0.pow(3) * m2 + 0.75 * r0.pow(5) * m1.square()
        return jets.product(xf, Jet(r0, r1, r2)).map(lambda z: z.to(x.z0.dtype))


def feature_jet(parameter: torch.Tensor, jets: JetPass, like: Jet) -> Jet:
    """A per-feature parameter (C,) along its directions, shaped to broadcast against ``like``'s
    coefficients: z0 = the parameter, z1 = its directions (K, 1, ..., 1, C), z2 = 0."""
    v = jets.direction(parameter)
    return Jet(parameter, v.view(v.size(0), *([1] * (like.z0.dim() - 1)), v.size(-1)))


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Explicit causal softmax(q kᵀ / √hs) v; twice differentiable, scores in at least float32."""
    T, hs = q.size(-2), q.size(-1)
    with _without_autocast(q):
        scores = _upcast(q) @ _upcast(k).transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return probs.to(v.dtype) @ v


def reference_attention_jet(q: Jet, k: Jet, v: Jet, jets: JetPass, key: nn.Module) -> Jet:
    """The jet of ``reference_attention``: scores s = (q/√hs) kᵀ and probs × values by the product
    rule, the softmax by its own; scores and values are the adjoint mode's nodes (keys (key, "scores"),
    (key, "values")), absorbed together by ``_attention_adjoint_jet``."""
    T, hs = q.z0.size(-2), q.z0.size(-1)
    future = torch.ones(T, T, dtype=torch.bool, device=q.z0.device).triu(1)
    with _without_autocast(q.z0):
        q, k = q.map(lambda z: _upcast(z) / math.sqrt(hs)), k.map(_upcast)
        lam_s, lam_o = jets.adjoint((key, "scores"), q, k, v), jets.adjoint((key, "values"), q, k, v)
        if lam_s is not None and lam_o is not None:
            return _attention_adjoint_jet(q, k, v, future, lam_s, lam_o, jets)
        scores = jets.product(q, k.map(lambda z: z.transpose(-2, -1)), torch.matmul, key=(key, "scores"))
        scores = Jet(scores.z0.masked_fill(future, float("-inf")), scores.z1, scores.z2)  # p0 = 0 there
        probs = jets.softmax(scores)
    return jets.product(probs.map(lambda z: z.to(v.z0.dtype)), v, torch.matmul, key=(key, "values"))


def _attention_adjoint_jet(
    q: Jet, k: Jet, v: Jet, future: torch.Tensor, lam_s: torch.Tensor, lam_o: torch.Tensor, jets: JetPass
) -> Jet:
    """The adjoint mode of ``reference_attention_jet`` (q already scaled, no input z2), fused so that
    each direction writes only two (T, T) tensors, c = s1 − ⟨p0, s1⟩ and p1 = p0 c.

    Own terms absorbed: 2⟨λ_s, q1k1ᵀ⟩ (scores), ⟨λ_s, c²⟩ (softmax: its ⟨λ_p, ·⟩ equals this, λ_s
    being the softmax's backward of λ_p) and 2⟨λ_o, p1v1⟩ (probs × values).
    """
    T = q.z0.size(-2)
    p0 = torch.softmax((q.z0 @ k.z0.transpose(-2, -1)).masked_fill(future, float("-inf")), dim=-1)
    v0, v1 = _upcast(v.z0), _upcast(v.z1)
    # ⟨p0, s1⟩ row by row, from s1 = q1k0ᵀ + q0k1ᵀ without forming s1: q1·(p0k0) + q0·(p0k1).
    m = (q.z1 * (p0 @ k.z0)).sum(-1, keepdim=True) + (q.z0 * shared_matmul(p0, k.z1)).sum(-1, keepdim=True)
    left = torch.cat([q.z1, q.z0.expand_as(q.z1), -m], dim=-1)  # (K, B, nh, T, 2hs + 1)
    right = torch.cat([k.z0.expand_as(k.z1), k.z1, torch.ones_like(m)], dim=-1)
    c = torch.matmul(left, right.transpose(-2, -1), out=jets.buffer("attention c", (*left.shape[:-1], T), left))
    p1 = torch.mul(p0, c, out=jets.buffer("attention p1", c.shape, c))  # (K, B, nh, T, T)
    jets.absorb(
        2 * per_direction_dot(shared_matmul(lam_s, k.z1), q.z1)
        + c.mul_(c).flatten(1) @ lam_s.flatten().to(c.dtype)  # c² in place: c is not used again
        + 2 * per_direction_dot(p1.transpose(-2, -1) @ lam_o.to(p1.dtype), v1)
    )
    return Jet(p0 @ v0, p1 @ v0 + shared_matmul(p0, v1)).map(lambda z: z.to(v.z0.dtype))


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
        q, k, v = (
            w(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
            for w in (self.wq, self.wk, self.wv)
        )
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.backend == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = reference_attention(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))

    def jet(self, x: Jet, cos: torch.Tensor, sin: torch.Tensor, jets: JetPass) -> Jet:
        """Linear projections, RoPE (linear: every coefficient), the attention core's jet, output projection."""
        B, T, C = x.z0.shape

        def heads(z: torch.Tensor) -> torch.Tensor:  # (..., B, T, C) -> (..., B, nh, T, hs)
            return z.view(*z.shape[:-1], self.n_heads, self.head_dim).transpose(-3, -2)

        def merge(z: torch.Tensor) -> torch.Tensor:  # (..., B, nh, T, hs) -> (..., B, T, C)
            return z.transpose(-3, -2).reshape(*z.shape[:-4], B, T, C)

        q, k, v = (linear_jet(x, w, jets).map(heads) for w in (self.wq, self.wk, self.wv))
        q, k = (z.map(lambda t: apply_rope(t, cos, sin)) for z in (q, k))
        y = reference_attention_jet(q, k, v, jets, key=self).map(merge)
        return linear_jet(y, self.wo, jets)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.w2 = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.w3 = nn.Linear(config.d_model, config.d_ff, bias=False)

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
            jets.absorb(per_direction_dot(t.addcmul_(b.z1, lam * d1, value=2), a.z1))  # ⟨λ, s″a1²b0 + 2s′a1b1⟩
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


class CausalLM(nn.Module):
    """What every architecture here shares: the output head (tied to the token embedding or not),
    the length check, and the loss's second-order rule. A subclass defines ``tok_embeddings``,
    ``output`` (None when tied), ``forward(idx)`` and ``jet(idx, jets)`` (the jet of the final
    normalised hidden state)."""

    config: ModelConfig
    attention_backend: AttentionBackend

    def _begin(self, config: ModelConfig, attention_backend: AttentionBackend) -> None:
        """The first modules of every architecture (the token embedding), after the backend check."""
        if attention_backend not in ("reference", "sdpa"):
            raise ValueError(f"attention_backend: expected 'reference' or 'sdpa', got {attention_backend!r}")
        self.config, self.attention_backend = config, attention_backend
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)

    def _end(self) -> None:
        """The last module (an untied head; tied: logits use tok_embeddings.weight directly, so the
        state dict holds the tensor once), then the initialisation."""
        self.output = (
            None if self.config.tie_embeddings else nn.Linear(self.config.d_model, self.config.vocab_size, bias=False)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: weights N(0, 0.02), residual projections (wo, w2) N(0, 0.02/√(2 n_layers)),
        norm weights 1, biases 0."""
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layers))
            else:
                nn.init.normal_(p, std=0.02)

    def _check_length(self, T: int) -> None:
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds model.max_seq_len={self.config.max_seq_len}")

    def _check_jet_backend(self) -> None:
        if self.attention_backend != "reference":
            raise ValueError(
                f"jets need reference attention; build {type(self).__name__}(config, attention_backend='reference')"
            )

    @property
    def head_weight(self) -> torch.Tensor:
        """The output projection (V, C): the embedding when tied."""
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, vocab) of the final normalised hidden state h (B, T, C)."""
        return F.linear(h, self.head_weight)

    def loss_jet(self, h: Jet, targets: torch.Tensor, jets: JetPass) -> torch.Tensor:
        """d²/dt² of Σ_t ℓ_t (summed cross-entropy of the non-ignored targets), shape (K,).

        With logits z = hEᵀ (E(t) = E + tU), p = softmax(z0) and r = p − e_y:
        ℓ2 = ⟨r, z2⟩ + ⟨p, z1²⟩ − ⟨p, z1⟩², where ⟨r, z2⟩ = ⟨rE, h2⟩ + 2⟨rU, h1⟩: z2 is never formed.
        The second part, z1ᵀ(diag(p) − ppᵀ)z1 summed over tokens, is the generalised Gauss–Newton
        form vᵀGv (G = Jᵀ ∇²ℓ J, J the Jacobian of the logits); it is left in ``jets.gauss_newton``.
        """
        weight = self.head_weight  # (V, C)
        U = jets.direction(weight)  # (K, V, C)
        K, V, C = U.shape
        z0 = self.logits(h.z0)  # (B, T, V)
        # z1 = h1Eᵀ + h0Uᵀ as one batched matmul per direction: [h1 | h0] [E | U]ᵀ, (K, B·T, V).
        left = torch.cat([h.z1, h.z0.expand_as(h.z1)], dim=-1).reshape(K, -1, 2 * C)
        right = torch.cat([weight.expand_as(U), U], dim=-1).transpose(1, 2)
        z1 = torch.bmm(left, right, out=jets.buffer("logits z1", (K, left.size(1), V), left))
        with _without_autocast(z0):
            keep = (targets != IGNORE_INDEX).reshape(-1, 1)  # (B·T, 1)
            p = torch.softmax(_upcast(z0).reshape(-1, V), dim=-1) * keep  # ignored rows: 0
            E, Ut = weight.to(p.dtype), U.transpose(1, 2).to(p.dtype)
            h0, h1 = _upcast(h.z0).reshape(-1, C), _upcast(h.z1).reshape(K, -1, C)
            p_z1 = (h1 * (p @ E)).sum(-1) + (h0 * per_direction(p, Ut)).sum(-1)  # ⟨p, z1⟩ by row, (K, B·T)
            z1 = _upcast(z1)
            curvature = z1.mul_(z1).flatten(1) @ p.flatten() - p_z1.square().sum(1)  # z1² in place
            r = p - F.one_hot(targets.reshape(-1).clamp(min=0), V).to(p.dtype) * keep  # (B·T, V)
            first = 2 * per_direction_dot(per_direction(r, Ut), h1)  # 2⟨rU, h1⟩
            if h.z2 is not None:
                first = first + per_direction_dot(_upcast(h.z2).reshape(K, -1, C), r @ E)  # rE: shared
        jets.gauss_newton = curvature
        return first + curvature


class Llama(CausalLM):
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
        self._begin(config, attention_backend)
        self.layers = nn.ModuleList(TransformerBlock(config, attention_backend) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self._end()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        self._check_length(T)
        cos, sin = rope_tables(T, self.config.head_dim, self.config.rope_theta, idx.device)
        x = self.tok_embeddings(idx)  # (B, T, C)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.logits(self.norm(x))

    def jet(self, idx: torch.Tensor, jets: JetPass) -> Jet:
        """The jet of the final normalised hidden state (B, T, C) along the directions of ``jets``."""
        self._check_jet_backend()
        cos, sin = rope_tables(idx.size(1), self.config.head_dim, self.config.rope_theta, idx.device)
        x = embedding_jet(idx, self.tok_embeddings, jets)
        if jets.recorded is not None and not x.z0.requires_grad:  # the record pass needs a graph
            x = Jet(x.z0.detach().requires_grad_(), x.z1)
        for layer in self.layers:
            x = layer.jet(x, cos, sin, jets)
        return self.norm.jet(x, jets)


_JET_LEAVES = (nn.Linear, nn.Embedding, nn.ModuleList)
"""Layer types whose rule is a function (``linear_jet``, ``embedding_jet``) or that hold layers;
every other layer type has a rule when it defines a ``jet`` method beside its ``forward``."""


def check_jet_rules(model: nn.Module) -> None:
    """Refuse a model that has a layer without a second-order rule, before any work.

    Raises:
        ValueError: naming the layer, its type and what to do.
    """
    if refusal := getattr(model, "jet_refusal", None):
        raise ValueError(refusal)
    for name, module in model.named_modules():
        if not isinstance(module, _JET_LEAVES) and not callable(getattr(type(module), "jet", None)):
            raise ValueError(
                f"layer {name or '<model>'} ({type(module).__name__}) has no second-order rule, so the "
                "taylor and adjoint engines cannot differentiate it; add its jet rule beside the layer "
                "(tiny_llm/model/) or use engine double_backward or pearlmutter"
            )
    if getattr(model, "attention_backend", "reference") != "reference":
        raise ValueError(
            f"jets need reference attention; build {type(model).__name__}(config, attention_backend='reference')"
        )


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
