"""transformers in float64 throughout, for the tests that compare our models with it at 1e-12.

transformers computes the RoPE frequencies, RMSNorm and the eager attention's softmax in float32
even for a float64 model: alone about 1e-7 of the logits' scale (measured 2e-8 to 3e-7 on the tiny
models of the tests), and a loss rounded at float32 resolution makes its Hessian differ by percents.
``float64_transformers`` swaps in transformers' own formulas carried out in float64, so that the
tests compare weights, names, layouts and formulas, not those float32 shortcuts.
"""

from __future__ import annotations

import importlib

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "gpt_neox": "GPTNeoX"}
"""transformers' model modules (``modeling_<key>``) and their class prefix."""


def _rms_norm(self, h):
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rotary(self, x, position_ids):
    """transformers' own rotary frequencies (default, linear or llama3; partial or whole), in
    float64: its init functions build them with ``dtype=torch.float``, read when they run."""
    init = self.compute_default_rope_parameters if self.rope_type == "default" else ROPE_INIT_FUNCTIONS[self.rope_type]
    float32, torch.float = torch.float, torch.float64
    try:
        inv_freq, scale = init(self.config)
    finally:
        torch.float = float32
    freqs = position_ids[..., None].double() * inv_freq.double()
    angles = torch.cat((freqs, freqs), dim=-1)
    return (angles.cos() * scale).to(x.dtype), (angles.sin() * scale).to(x.dtype)


def _eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """The eager attention with its softmax in the model's dtype (grouped key/value heads repeated)."""
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[..., : key.shape[-2]]
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def float64_transformers(monkeypatch) -> None:
    """Swap transformers' float32 RoPE, RMSNorm and eager softmax for float64 (see the module)."""
    for family, prefix in FAMILIES.items():
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        if hasattr(module, f"{prefix}RMSNorm"):  # GPT-NeoX's LayerNorm is torch's, exact in float64
            monkeypatch.setattr(getattr(module, f"{prefix}RMSNorm"), "forward", _rms_norm)
        monkeypatch.setattr(getattr(module, f"{prefix}RotaryEmbedding"), "forward", _rotary)
        monkeypatch.setattr(module, "eager_attention_forward", _eager_attention)
