"""How each Hugging Face architecture we read natively names, lays out and configures our models'
tensors: one literal key map per architecture, written once, its configuration both ways, and what
it cannot represent (refused by name). A new native architecture adds its maps, its two
configuration functions and one entry of ``FORMATS``.

* Llama: no tensor is permuted. Our RoPE rotates the two halves of each head's features
  (``apply_rope``), which is the layout of ``transformers``' ``LlamaForCausalLM`` (its
  ``rotate_half``); the permutation that Meta's original checkpoints need (interleaved pairs to
  halves) is applied by ``transformers``' own conversion script, before a checkpoint reaches this
  format. The projections are stored as (out, in) in both.
* GPT-2: its projections are ``Conv1D`` layers, which store the weight as (in, out) and compute
  x W + b; ours are ``nn.Linear``, (out, in), so those four weights (``GPT2_TRANSPOSED``) are
  transposed both ways. q, k and v stay fused in one projection (``wqkv``, their ``c_attn``), in
  the same order. The causal-mask buffers older versions saved (``attn.bias``,
  ``attn.masked_bias``) are derived, not weights, and are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiny_llm.config import ModelConfig

__all__ = [
    "FORMATS",
    "GPT2_LAYER_KEYS",
    "GPT2_MODEL_KEYS",
    "GPT2_TRANSPOSED",
    "LLAMA_LAYER_KEYS",
    "LLAMA_MODEL_KEYS",
    "Format",
    "refusal",
]


LLAMA_LAYER_KEYS = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",  # silu(w1 x) * w3 x: the gate
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
"""Llama: our key inside ``layers.{i}.`` -> theirs inside ``model.layers.{i}.``."""


LLAMA_MODEL_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
"""Llama: our keys outside the layers -> theirs (``output.weight`` only for an untied head)."""


GPT2_LAYER_KEYS = {
    "attention_norm.weight": "ln_1.weight",
    "attention_norm.bias": "ln_1.bias",
    "attention.wqkv.weight": "attn.c_attn.weight",
    "attention.wqkv.bias": "attn.c_attn.bias",
    "attention.wo.weight": "attn.c_proj.weight",
    "attention.wo.bias": "attn.c_proj.bias",
    "ffn_norm.weight": "ln_2.weight",
    "ffn_norm.bias": "ln_2.bias",
    "feed_forward.w1.weight": "mlp.c_fc.weight",
    "feed_forward.w1.bias": "mlp.c_fc.bias",
    "feed_forward.w2.weight": "mlp.c_proj.weight",
    "feed_forward.w2.bias": "mlp.c_proj.bias",
}
"""GPT-2: our key inside ``layers.{i}.`` -> theirs inside ``transformer.h.{i}.``."""


GPT2_MODEL_KEYS = {
    "tok_embeddings.weight": "transformer.wte.weight",
    "pos_embeddings.weight": "transformer.wpe.weight",
    "norm.weight": "transformer.ln_f.weight",
    "norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
}
"""GPT-2: our keys outside the layers -> theirs (``output.weight`` only for an untied head)."""


GPT2_TRANSPOSED = frozenset(
    {"attention.wqkv.weight", "attention.wo.weight", "feed_forward.w1.weight", "feed_forward.w2.weight"}
)
"""GPT-2 layer keys whose tensor is stored transposed there (``Conv1D``: (in, out))."""


def refusal(source: str) -> Callable[[str, Any, str], ValueError]:
    """``refuse(key, found, need)``: the one-line error for a configuration value of ``source``
    that our models cannot represent."""

    def refuse(key: str, found: Any, need: str) -> ValueError:
        return ValueError(f"{source}: {key}={found!r} cannot be represented here ({need})")

    return refuse


def _llama_config(data: dict[str, Any], source: str) -> ModelConfig:
    refuse = refusal(source)
    heads = data["num_attention_heads"]
    if data.get("num_key_value_heads", heads) != heads:
        raise refuse("num_key_value_heads", data["num_key_value_heads"], f"grouped-query attention; need {heads}")
    for key in ("attention_bias", "mlp_bias"):
        if data.get(key):
            raise refuse(key, data[key], "biases; need false")
    if data.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", data["hidden_act"], "need silu (SwiGLU)")
    rope = data.get("rope_parameters") or {}
    if data.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        raise refuse("rope_scaling", data.get("rope_scaling") or rope, "RoPE scaling; need none")
    head_dim = data.get("head_dim") or data["hidden_size"] // heads
    if head_dim * heads != data["hidden_size"]:
        raise refuse("head_dim", head_dim, f"need hidden_size / num_attention_heads = {data['hidden_size'] // heads}")
    return ModelConfig(
        vocab_size=data["vocab_size"],
        d_model=data["hidden_size"],
        n_layers=data["num_hidden_layers"],
        n_heads=heads,
        d_ff=data["intermediate_size"],
        max_seq_len=data["max_position_embeddings"],
        rope_theta=float(data.get("rope_theta") or rope.get("rope_theta", 10000.0)),
        norm_eps=float(data["rms_norm_eps"]),
        tie_embeddings=bool(data.get("tie_word_embeddings", True)),
    )


def _llama_hf_config(config: ModelConfig) -> dict[str, Any]:
    """``rope_theta`` both where transformers 4 and 5 read it."""
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.d_ff,
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }


def _gpt2_config(data: dict[str, Any], source: str) -> ModelConfig:
    refuse = refusal(source)
    if data.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise refuse("activation_function", data["activation_function"], "need gelu_new (tanh-approximated GELU)")
    if not data.get("scale_attn_weights", True):
        raise refuse("scale_attn_weights", data["scale_attn_weights"], "need true (scores / √head_dim)")
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if data.get(key):
            raise refuse(key, data[key], "need false")
    width = data.get("n_embd", 768)
    return ModelConfig(
        architecture="gpt2",
        vocab_size=data.get("vocab_size", 50257),
        d_model=width,
        n_layers=data.get("n_layer", 12),
        n_heads=data.get("n_head", 12),
        d_ff=data.get("n_inner") or 4 * width,
        max_seq_len=data.get("n_positions", 1024),
        norm_eps=float(data.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(data.get("tie_word_embeddings", True)),
    )


def _gpt2_hf_config(config: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": config.vocab_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": config.d_ff,
        "n_positions": config.max_seq_len,
        "n_ctx": config.max_seq_len,
        "layer_norm_epsilon": config.norm_eps,
        "activation_function": "gelu_new",
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


@dataclass(frozen=True)
class Format:
    """How one Hugging Face architecture names, lays out and configures our model's tensors."""

    hf_class: str
    layer_prefix: str
    layer_keys: dict[str, str]
    model_keys: dict[str, str]
    config_from: Callable[[dict[str, Any], str], ModelConfig]
    config_to: Callable[[ModelConfig], dict[str, Any]]
    transposed: frozenset[str] = frozenset()
    derived: re.Pattern = re.compile(r"$^")
    """Their buffers that are not weights (skipped on import)."""

    def theirs(self, key: str) -> str:
        if key in self.model_keys:
            return self.model_keys[key]
        match = re.fullmatch(r"layers\.(\d+)\.(.+)", key)
        if match and match.group(2) in self.layer_keys:
            return f"{self.layer_prefix}.{match.group(1)}.{self.layer_keys[match.group(2)]}"
        raise ValueError(f"parameter {key} has no Hugging Face {self.hf_class} counterpart")

    def flips(self, key: str) -> bool:
        return key.split(".", 2)[-1] in self.transposed if key.startswith("layers.") else False


FORMATS = {
    "llama": Format(
        "LlamaForCausalLM",
        "model.layers",
        LLAMA_LAYER_KEYS,
        LLAMA_MODEL_KEYS,
        _llama_config,
        _llama_hf_config,
        derived=re.compile(r".*rotary_emb\.inv_freq"),
    ),
    "gpt2": Format(
        "GPT2LMHeadModel",
        "transformer.h",
        GPT2_LAYER_KEYS,
        GPT2_MODEL_KEYS,
        _gpt2_config,
        _gpt2_hf_config,
        transposed=GPT2_TRANSPOSED,
        derived=re.compile(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)"),
    ),
}
"""model_type -> its format. Other model types are analysed through the adapter (HVP engines)."""
