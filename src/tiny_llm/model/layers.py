"""Layers and second-order (jet) rules that more than one architecture uses: linear maps, embeddings,
per-feature parameters, RMS normalisation and LayerNorm (its centred form), rotary positions (whole
or partial, with frequency scaling), grouped-query heads and the explicit causal attention with its
adjoint-mode fusion. An architecture's own layers keep their rules beside them
in its module.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tiny_llm.config import ModelConfig
from tiny_llm.model.causal import CausalLM, upcast, without_autocast
from tiny_llm.model.jets import Jet, JetPass, directions_last, per_direction, per_direction_dot, wide_matmul

__all__ = [
    "LayerNorm",
    "RotaryDecoder",
    "apply_rope",
    "embedding_jet",
    "feature_jet",
    "linear_jet",
    "reference_attention",
    "reference_attention_jet",
    "repeat_kv",
    "rms_normalize_jet",
    "rope_tables",
    "rotary_frequencies",
]


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
        N = lam.numel() // m  # tokens
        if N > m:  # 2⟨V, λᵀx1⟩: over the tokens first, (K, out, in) is smaller than λV's (K, tokens, in)
            # λᵀ laid out once (a small copy): the batched product reads it K times, faster than
            # through a transposed view (0.8M shape: this product 8–10 % faster on one CPU thread).
            shared = lam.reshape(N, m).t().to(x.z1.dtype).contiguous().unsqueeze(0).expand(K, m, N)
            lam_x = torch.bmm(shared, x.z1.reshape(K, N, n), out=jets.buffer("linear λᵀx1", (K, m, n), x.z1))
            jets.absorb(2 * per_direction_dot(lam_x, V, overwrite=True))
        else:
            lam_v = per_direction(lam, V.transpose(1, 2), buffer=jets.buffer("linear λV", (K, N, n), V))
            jets.absorb(2 * per_direction_dot(lam_v, x.z1, overwrite=True))  # 2⟨λV, x1⟩
        return Jet(y0, y1)
    y2 = 2 * torch.bmm(x.z1.reshape(K, x.z0.numel() // n, n), V.transpose(1, 2)).view(y1.shape)
    return jets.emit(linear, Jet(y0, y1, y2 if x.z2 is None else y2 + F.linear(x.z2, W)))


def embedding_jet(idx: torch.Tensor, embedding: nn.Embedding, jets: JetPass) -> Jet:
    """Lookup E[idx] with E(t) = E + tU: linear in E, so e1 = U[idx] and e2 = 0."""
    return Jet(embedding(idx), jets.direction_rows(embedding.weight, idx))


def rms_normalize_jet(x: Jet, eps: float, jets: JetPass) -> Jet:
    """x·r with r = m^(−½), m = mean(x²) + ε, reduced in at least float32: m1 = 2⟨x0, x1⟩/C,
    m2 = 2(⟨x1, x1⟩ + ⟨x0, x2⟩)/C, r1 = −½m^(−3/2)m1, r2 = −½m^(−3/2)m2 + ¾m^(−5/2)m1², then the
    product rule."""
    with without_autocast(x.z0):
        xf = x.map(upcast)
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


def rotary_frequencies(config: ModelConfig, device: torch.device | None = None) -> torch.Tensor:
    """The rotary inverse frequencies θ^(−2i/d), i < d/2, d = config.rotary_dim, in float64, after
    the configured scaling: ``linear`` divides all by the factor; ``llama3`` divides those whose
    wavelength 2π/f exceeds L/low_freq_factor (L the original context), keeps those below
    L/high_freq_factor and blends in between with s = (L/wavelength − low) / (high − low)."""
    d = config.rotary_dim
    inv_freq = config.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    L, low, high = scaling.original_max_seq_len, scaling.low_freq_factor, scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > L / low, inv_freq / scaling.factor, inv_freq)
    smooth = (L / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelength >= L / high) & (wavelength <= L / low)
    return torch.where(medium, blended, scaled)


def rope_tables(T: int, config: ModelConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles of positions 0..T−1, shape (T, rotary_dim // 2), in float64."""
    angles = torch.outer(torch.arange(T, dtype=torch.float64, device=device), rotary_frequencies(config, device))
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the first 2·cos.size(−1) features of each head (all of them unless
    the rotation is partial); the others pass unchanged: x (..., T, hs) -> (..., T, hs). Linear in
    x, so a jet's every coefficient is rotated alike."""
    half = cos.size(-1)
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if torch.is_grad_enabled():  # out= does not record for autograd
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest), dim=-1)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)  # a jet's K tangents: no temporaries
    y1, y2 = y[..., :half], y[..., half : 2 * half]
    torch.mul(x1, cos, out=y1).addcmul_(x2, sin, value=-1)
    torch.mul(x1, sin, out=y2).addcmul_(x2, cos)
    y[..., 2 * half :].copy_(rest)
    return y


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention: each key/value head serves ``groups`` consecutive query heads,
    (..., n_kv, T, hs) -> (..., n_kv·groups, T, hs). Linear: a jet's coefficients repeat alike."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=-3)


class LayerNorm(nn.Module):
    """(x − mean x) / √(var x + ε) · weight + bias, the statistics reduced in at least float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with without_autocast(x):
            xc = upcast(x)
            xc = xc - xc.mean(-1, keepdim=True)
            normed = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight + self.bias

    def jet(self, x: Jet, jets: JetPass) -> Jet:
        """Centring is linear (every coefficient loses its mean); the centred jet is then
        normalised as in RMSNorm (mean(xc²) is the variance), times w(t) = w + t·w_v, plus
        b(t) = b + t·b_v."""
        centred = x.map(lambda z: z - z.mean(-1, keepdim=True))
        scaled = jets.product(rms_normalize_jet(centred, self.eps, jets), feature_jet(self.weight, jets, x))
        return jets.emit(self, scaled + feature_jet(self.bias, jets, x))


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Explicit causal softmax(q kᵀ / √hs) v; twice differentiable, scores in at least float32."""
    T, hs = q.size(-2), q.size(-1)
    with without_autocast(q):
        scores = upcast(q) @ upcast(k).transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return probs.to(v.dtype) @ v


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
    """Causal attention of heads (..., nh, T, hs): the fused ``scaled_dot_product_attention`` with
    backend ``sdpa`` (training), else ``reference_attention`` (twice differentiable: analysis)."""
    if backend == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return reference_attention(q, k, v)


def reference_attention_jet(q: Jet, k: Jet, v: Jet, jets: JetPass, key: nn.Module) -> Jet:
    """The jet of ``reference_attention``: scores s = (q/√hs) kᵀ and probs × values by the product
    rule, the softmax by its own; scores and values are the adjoint mode's nodes (keys (key, "scores"),
    (key, "values")), absorbed together by ``_attention_adjoint_jet``."""
    T, hs = q.z0.size(-2), q.z0.size(-1)
    future = torch.ones(T, T, dtype=torch.bool, device=q.z0.device).triu(1)
    with without_autocast(q.z0):
        q, k = q.map(lambda z: upcast(z) / math.sqrt(hs)), k.map(upcast)
        lam_s, lam_o = jets.adjoint((key, "scores"), q, k, v), jets.adjoint((key, "values"), q, k, v)
        if lam_s is not None and lam_o is not None:
            return _attention_adjoint_jet(q, k, v, future, lam_s, lam_o, jets)
        scores = jets.product(q, k.map(lambda z: z.transpose(-2, -1)), torch.matmul, key=(key, "scores"))
        scores = Jet(scores.z0.masked_fill(future, float("-inf")), scores.z1, scores.z2)  # p0 = 0 there
        probs = jets.softmax(scores)
    return jets.product(probs.map(lambda z: z.to(v.z0.dtype)), v, torch.matmul, key=(key, "values"))


ATTENTION_ROW_BLOCKS = 8
"""Query blocks of the adjoint attention rule: block i meets only the keys up to its end (the later
ones are masked: p0 and λ_s are exactly zero there), so the per-direction (T, T) work and memory
shrink to (b + 1)/2b and 1/b of it (at T = 1024, 2 layers of width 128, K = 16: a pass 3.2 → 2.4 s
on one CPU thread; at T = 128, 5 % faster)."""


def _row_blocks(T: int) -> list[tuple[int, int]]:
    """Query rows [a, e) of each block: ATTENTION_ROW_BLOCKS equal blocks, of at least 32 rows."""
    size = max(32, -(-T // ATTENTION_ROW_BLOCKS))
    return [(a, min(a + size, T)) for a in range(0, T, size)]


def _attention_adjoint_jet(
    q: Jet, k: Jet, v: Jet, future: torch.Tensor, lam_s: torch.Tensor, lam_o: torch.Tensor, jets: JetPass
) -> Jet:
    """The adjoint mode of ``reference_attention_jet`` (q already scaled, no input z2), fused so that
    each direction writes only two score-shaped tensors, c = s1 − ⟨p0, s1⟩ and p1 = p0 c, one block
    of query rows at a time against the keys up to the block's end (causal: the rest is zero).

    Own terms absorbed: 2⟨λ_s, q1k1ᵀ⟩ (scores), ⟨λ_s, c²⟩ (softmax: its ⟨λ_p, ·⟩ equals this, λ_s
    being the softmax's backward of λ_p) and 2⟨λ_o, p1v1⟩ (probs × values).
    """
    T = q.z0.size(-2)
    p0 = torch.softmax((q.z0 @ k.z0.transpose(-2, -1)).masked_fill(future, float("-inf")), dim=-1)
    v0, v1 = upcast(v.z0), upcast(v.z1)
    p0k0, lam_s, lam_o = p0 @ k.z0, lam_s.to(p0.dtype), lam_o.to(p0.dtype)
    width = 2 * q.z1.size(-1) + 1
    right = torch.cat(  # rows [k0, k1, 1] against left's [q1, q0, −⟨p0, s1⟩]: c = left · rightᵀ
        [k.z0.expand_as(k.z1), k.z1, torch.ones_like(k.z1[..., :1])],
        dim=-1,
        out=jets.buffer("attention right", (*k.z1.shape[:-1], width), k.z1),
    )
    blocks = _row_blocks(T)
    lead, rows = q.z1.shape[:-2], blocks[0][1] - blocks[0][0]
    scratch = {  # each block's tensors are views of one buffer sized for the largest block
        name: jets.buffer(f"attention {name}", (math.prod(lead) * rows * columns,), q.z1)
        for name, columns in (("left", width), ("c", T), ("p1", T))
    }

    def view(name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        return None if scratch[name] is None else scratch[name][: math.prod(shape)].view(shape)

    K = q.z1.size(0)
    k1_wide, v1_wide = directions_last(k.z1), directions_last(v1)  # once, not once per block
    out1, absorbed = torch.empty_like(v1), 0
    for a, e in blocks:
        shape = (*lead, e - a, e)

        q1, q0, k1, p0_, lam = (
            q.z1[..., a:e, :],
            q.z0[..., a:e, :],
            k1_wide[..., :e, :],
            p0[..., a:e, :e],
            lam_s[..., a:e, :e],
        )
        # ⟨p0, s1⟩ row by row, from s1 = q1k0ᵀ + q0k1ᵀ without forming s1: q1·(p0k0) + q0·(p0k1).
        m = (q1 * p0k0[..., a:e, :]).sum(-1, keepdim=True) + (q0 * wide_matmul(p0_, k1, K)).sum(-1, keepdim=True)
        left = torch.cat([q1, q0.expand_as(q1), -m], dim=-1, out=view("left", (*lead, e - a, width)))
        c = torch.matmul(left, right[..., :e, :].transpose(-2, -1), out=view("c", shape))
        p1 = torch.mul(p0_, c, out=view("p1", shape))
        absorbed = (
            absorbed
            + (
                2 * per_direction_dot(wide_matmul(lam, k1, K), q1, overwrite=True)
                + per_direction_dot(c.mul_(c), lam)  # c² in place: c is not used again
                + 2 * per_direction_dot(p1.transpose(-2, -1) @ lam_o[..., a:e, :], v1[..., :e, :], overwrite=True)
            )
        )
        torch.add(p1 @ v0[..., :e, :], wide_matmul(p0_, v1_wide[..., :e, :], K), out=out1[..., a:e, :])
    jets.absorb(absorbed)
    return Jet(p0 @ v0, out1).map(lambda z: z.to(v.z0.dtype))


class RotaryDecoder(CausalLM):
    """A decoder whose blocks take the rotary tables (the Llama family, GPT-NeoX): the token
    embedding, ``layers`` called as ``layer(x, cos, sin)`` (and ``layer.jet(x, cos, sin, jets)``),
    then the final ``norm``."""

    layers: nn.ModuleList
    norm: nn.Module
    block: type[nn.Module]
    """A subclass's block, built as ``block(config, attention_backend)``."""
    final_norm: type[nn.Module]
    """A subclass's final norm, built as ``final_norm(d_model, norm_eps)``."""

    def __init__(self, config: ModelConfig, attention_backend: str = "reference"):
        super().__init__()
        self._begin(config, attention_backend)
        self.layers = nn.ModuleList(self.block(config, attention_backend) for _ in range(config.n_layers))
        self.norm = self.final_norm(config.d_model, config.norm_eps)
        self._end()

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final normalised hidden state (B, T, C) of token ids (B, T)."""
        self._check_length(idx.size(1))
        cos, sin = rope_tables(idx.size(1), self.config, idx.device)
        x = self.tok_embeddings(idx)  # (B, T, C)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)

    def jet(self, idx: torch.Tensor, jets: JetPass) -> Jet:
        """The jet of the final normalised hidden state (B, T, C) along the directions of ``jets``."""
        self._check_jet_backend()
        self._check_length(idx.size(1))
        cos, sin = rope_tables(idx.size(1), self.config, idx.device)
        x = embedding_jet(idx, self.tok_embeddings, jets)
        if jets.recorded is not None and not x.z0.requires_grad:  # the record pass needs a graph
            x = Jet(x.z0.detach().requires_grad_(), x.z1)
        for layer in self.layers:
            x = layer.jet(x, cos, sin, jets)
        return self.norm.jet(x, jets)
