"""How each Hugging Face architecture we read natively names, lays out and configures our models'
tensors: each architecture's key maps and transposed keys, read from its parameter table
(:class:`tiny_llm.shapes.ParameterTable`, where each parameter's checkpoint key is declared once),
its configuration both ways, and what it cannot represent (refused by name). A new native
architecture declares its table, adds its two configuration functions and its entries of
``FORMATS`` (by Hugging Face ``model_type``, for import) and ``export_format`` (by our
architecture).

* Llama family (``llama``, ``mistral``, ``qwen2``): one key map; no tensor is permuted. Grouped-query
  heads are stored as they are (k and v with n_kv_heads × head_dim rows); Qwen2's q/k/v biases and
  Llama's ``attention_bias``/``mlp_bias`` map to the same bias keys. Our Llama exports as a
  ``LlamaForCausalLM`` unless only q, k and v are biased (``Qwen2ForCausalLM``), so a Mistral
  checkpoint comes back as the Llama it computes. Our RoPE rotates the two halves of each head's features
  (``apply_rope``), which is the layout of ``transformers``' ``LlamaForCausalLM`` (its
  ``rotate_half``); the permutation that Meta's original checkpoints need (interleaved pairs to
  halves) is applied by ``transformers``' own conversion script, before a checkpoint reaches this
  format. The projections are stored as (out, in) in both.
* GPT-2: its projections are ``Conv1D`` layers, which store the weight as (in, out) and compute
  x W + b; ours are ``nn.Linear``, (out, in), so those four weights (``GPT2_TRANSPOSED``) are
  transposed both ways. q, k and v stay fused in one projection (``wqkv``, their ``c_attn``), in
  the same order. The causal-mask buffers older versions saved (``attn.bias``,
  ``attn.masked_bias``) are derived, not weights, and are skipped.
* GPT-NeoX: no tensor is permuted either: our ``wqkv`` keeps their ``query_key_value`` layout (by
  head, each head's q, k, v side by side), and the model splits it that way. The rotary
  ``inv_freq`` and causal-mask buffers are derived and skipped. The head is ``embed_out``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiny_llm.config import ModelConfig
from tiny_llm.model.hf_values import flag, given, mapping, model, positive, refusal, rope
from tiny_llm.shapes import GPT2, GPT_NEOX, LLAMA

__all__ = [
    "FORMATS",
    "GPT_NEOX_LAYER_KEYS",
    "GPT_NEOX_MODEL_KEYS",
    "GPT2_LAYER_KEYS",
    "GPT2_MODEL_KEYS",
    "GPT2_TRANSPOSED",
    "LLAMA_LAYER_KEYS",
    "LLAMA_MODEL_KEYS",
    "Format",
    "export_format",
    "refusal",
]


LLAMA_LAYER_KEYS = LLAMA.layer_keys()
"""Llama family: our key inside ``layers.{i}.`` -> theirs inside ``model.layers.{i}.`` (the bias
keys only where the configuration has biases), from its parameter table."""

LLAMA_MODEL_KEYS = LLAMA.root_keys()
"""Llama: our keys outside the layers -> theirs (``output.weight`` only for an untied head)."""

GPT2_LAYER_KEYS = GPT2.layer_keys()
"""GPT-2: our key inside ``layers.{i}.`` -> theirs inside ``transformer.h.{i}.``."""

GPT2_MODEL_KEYS = GPT2.root_keys()
"""GPT-2: our keys outside the layers -> theirs (``output.weight`` only for an untied head)."""

GPT_NEOX_LAYER_KEYS = GPT_NEOX.layer_keys()
"""GPT-NeoX: our key inside ``layers.{i}.`` -> theirs inside ``gpt_neox.layers.{i}.``."""

GPT_NEOX_MODEL_KEYS = GPT_NEOX.root_keys()
"""GPT-NeoX: our keys outside the layers -> theirs (``output.weight`` only for an untied head)."""

GPT2_TRANSPOSED = GPT2.transposed()
"""GPT-2 layer keys whose tensor is stored transposed there (``Conv1D``: (in, out))."""


def _rope_hf(config: ModelConfig) -> dict[str, Any]:
    """RoPE's keys both where transformers 4 (``rope_theta``, ``rope_scaling``) and 5
    (``rope_parameters``) read them."""
    scaling = config.rope_scaling
    if scaling is None:
        parameters: dict[str, Any] = {"rope_type": "default"}
    elif scaling.kind == "linear":
        parameters = {"rope_type": "linear", "factor": scaling.factor}
    else:
        parameters = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_seq_len,
        }
    return {
        "rope_theta": config.rope_theta,
        "rope_scaling": None if scaling is None else dict(parameters),
        "rope_parameters": {**parameters, "rope_theta": config.rope_theta},
    }


def _sliding_window(data: dict[str, Any]) -> int | None:
    """The attention window of a Mistral or Qwen2 config.json, when one applies."""
    if data.get("model_type") == "qwen2":
        sliding = data.get("use_sliding_window") or "sliding_attention" in (data.get("layer_types") or ())
        return data.get("sliding_window") if sliding else None
    return data.get("sliding_window")


_COMMON_KEYS = {"rope_theta": "rope_theta", "rope_scaling": "rope_scaling", "tie_embeddings": "tie_word_embeddings"}
LLAMA_KEYS = {
    **_COMMON_KEYS,
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "d_ff": "intermediate_size",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
}
"""A Llama-family config.json's key of each ModelConfig field (a refused value is named by it)."""
GPT2_KEYS = {
    "tie_embeddings": "tie_word_embeddings",
    "vocab_size": "vocab_size",
    "d_model": "n_embd",
    "n_layers": "n_layer",
    "n_heads": "n_head",
    "d_ff": "n_inner",
    "max_seq_len": "n_positions",
    "norm_eps": "layer_norm_epsilon",
}
"""GPT-2's config.json key of each ModelConfig field."""
GPT_NEOX_KEYS = {
    **LLAMA_KEYS,
    "norm_eps": "layer_norm_eps",
    "rotary_pct": "rotary_pct",
    "parallel_residual": "use_parallel_residual",
}
"""GPT-NeoX's config.json key of each ModelConfig field."""


def _llama_config(data: dict[str, Any], source: str) -> ModelConfig:
    """The Llama family: Llama 2/3 (GQA, biases, RoPE scaling), Mistral and Qwen2 without a window."""
    refuse = refusal(source)
    for key in ("num_attention_heads", "hidden_size", "max_position_embeddings"):
        positive(data, key, refuse)
    heads, context = data["num_attention_heads"], data["max_position_embeddings"]
    kv_heads = data.get("num_key_value_heads")
    if kv_heads is None:
        kv_heads = heads
    elif isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise refuse("num_key_value_heads", kv_heads, f"need a positive divisor of num_attention_heads ({heads})")
    if (window := _sliding_window(data)) is not None and window < context:
        raise refuse("sliding_window", window, f"attention over the whole context; need null or ≥ {context}")
    if data.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", data["hidden_act"], "need silu (SwiGLU)")
    head_dim = positive(data, "head_dim", refuse, default=data["hidden_size"] // heads)
    if head_dim * heads != data["hidden_size"]:
        raise refuse("head_dim", head_dim, f"need hidden_size / num_attention_heads = {data['hidden_size'] // heads}")
    theta, scaling = rope(data, refuse)
    attention_bias = "qkv" if data["model_type"] == "qwen2" else "all" if flag(data, "attention_bias", False) else None
    return model(
        source,
        LLAMA_KEYS,
        vocab_size=data["vocab_size"],
        d_model=data["hidden_size"],
        n_layers=data["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=None if kv_heads == heads else kv_heads,
        d_ff=data["intermediate_size"],
        max_seq_len=context,
        rope_theta=theta,
        rope_scaling=scaling,
        attention_bias=attention_bias,
        mlp_bias=True if flag(data, "mlp_bias", False) else None,
        norm_eps=data["rms_norm_eps"],
        tie_embeddings=flag(data, "tie_word_embeddings", True),
    )


def _llama_hf_config(config: ModelConfig) -> dict[str, Any]:
    """A Llama, or a Qwen2 when only q, k and v are biased (the one layout Llama cannot say)."""
    common = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.d_ff,
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        **_rope_hf(config),
        "hidden_act": "silu",
    }
    if config.attention_biases == "qkv":
        if config.mlp_biased:
            raise ValueError("model.mlp_bias: true with attention_bias qkv has no Hugging Face counterpart")
        return {**common, "use_sliding_window": False, "sliding_window": None}
    return {**common, "attention_bias": config.attention_biases == "all", "mlp_bias": config.mlp_biased}


def _gpt2_config(data: dict[str, Any], source: str) -> ModelConfig:
    refuse = refusal(source)
    if data.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise refuse("activation_function", data["activation_function"], "need gelu_new (tanh-approximated GELU)")
    if not data.get("scale_attn_weights", True):
        raise refuse("scale_attn_weights", data["scale_attn_weights"], "need true (scores / √head_dim)")
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if data.get(key):
            raise refuse(key, data[key], "need false")
    width = positive(data, "n_embd", refuse, default=768)
    return model(
        source,
        GPT2_KEYS,
        architecture="gpt2",
        vocab_size=given(data, "vocab_size", default=50257)[1],
        d_model=width,
        n_layers=given(data, "n_layer", default=12)[1],
        n_heads=given(data, "n_head", default=12)[1],
        d_ff=given(data, "n_inner", default=4 * width)[1],
        max_seq_len=given(data, "n_positions", default=1024)[1],
        norm_eps=given(data, "layer_norm_epsilon", default=1e-5)[1],
        tie_embeddings=flag(data, "tie_word_embeddings", True),
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


def _gpt_neox_config(data: dict[str, Any], source: str) -> ModelConfig:
    """GPT-NeoX (Pythia): partial rotary from ``rotary_pct`` or ``partial_rotary_factor``."""
    refuse = refusal(source)
    if data.get("hidden_act", "gelu") != "gelu":
        raise refuse("hidden_act", data["hidden_act"], "need gelu (exact, erf)")
    parameters = mapping(data, "rope_parameters", refuse)
    key, rotary_pct = given({**parameters, **data}, "rotary_pct", "partial_rotary_factor", default=0.25)
    if isinstance(rotary_pct, bool) or not isinstance(rotary_pct, int | float) or not 0 < rotary_pct <= 1:
        raise refuse(key, rotary_pct, "a fraction in (0, 1] of each head rotated: a model without RoPE is not one")
    theta, scaling = rope(data, refuse)
    return model(
        source,
        GPT_NEOX_KEYS,
        architecture="gpt_neox",
        vocab_size=data["vocab_size"],
        d_model=data["hidden_size"],
        n_layers=data["num_hidden_layers"],
        n_heads=data["num_attention_heads"],
        d_ff=data["intermediate_size"],
        max_seq_len=data["max_position_embeddings"],
        rope_theta=theta,
        rope_scaling=scaling,
        rotary_pct=float(rotary_pct),
        attention_bias=None if flag(data, "attention_bias", True) else "none",
        parallel_residual=flag(data, "use_parallel_residual", True),
        norm_eps=given(data, "layer_norm_eps", default=1e-5)[1],
        tie_embeddings=flag(data, "tie_word_embeddings", False),
    )


def _gpt_neox_hf_config(config: ModelConfig) -> dict[str, Any]:
    if not config.mlp_biased:
        raise ValueError("model.mlp_bias: false has no GPTNeoXForCausalLM counterpart (its MLP is biased)")
    rope = _rope_hf(config)
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff,
        "max_position_embeddings": config.max_seq_len,
        "rotary_pct": config.rotary_pct,
        "rotary_emb_base": config.rope_theta,
        **rope,
        "rope_parameters": {**rope["rope_parameters"], "partial_rotary_factor": config.rotary_pct},
        "attention_bias": config.attention_biases == "all",
        "use_parallel_residual": config.parallel_residual,
        "layer_norm_eps": config.norm_eps,
        "hidden_act": "gelu",
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
    }


@dataclass(frozen=True)
class Format:
    """How one Hugging Face architecture names, lays out and configures our model's tensors."""

    model_type: str
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


def _llama_family(model_type: str, hf_class: str) -> Format:
    return Format(
        model_type,
        hf_class,
        "model.layers",
        LLAMA_LAYER_KEYS,
        LLAMA_MODEL_KEYS,
        _llama_config,
        _llama_hf_config,
        derived=re.compile(r".*rotary_emb\.inv_freq"),
    )


_GPT2 = Format(
    "gpt2",
    "GPT2LMHeadModel",
    "transformer.h",
    GPT2_LAYER_KEYS,
    GPT2_MODEL_KEYS,
    _gpt2_config,
    _gpt2_hf_config,
    transposed=GPT2_TRANSPOSED,
    derived=re.compile(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)"),
)

_GPT_NEOX = Format(
    "gpt_neox",
    "GPTNeoXForCausalLM",
    "gpt_neox.layers",
    GPT_NEOX_LAYER_KEYS,
    GPT_NEOX_MODEL_KEYS,
    _gpt_neox_config,
    _gpt_neox_hf_config,
    derived=re.compile(
        r"gpt_neox\.(layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)|rotary_emb\.inv_freq)"
    ),
)

FORMATS = {
    "llama": _llama_family("llama", "LlamaForCausalLM"),
    "mistral": _llama_family("mistral", "MistralForCausalLM"),
    "qwen2": _llama_family("qwen2", "Qwen2ForCausalLM"),
    "gpt2": _GPT2,
    "gpt_neox": _GPT_NEOX,
}
"""model_type -> its format, for import. Other model types are analysed through the adapter (HVP
engines)."""


def export_format(config: ModelConfig) -> Format:
    """The Hugging Face format our ``config`` is written in: its architecture's, a Llama with only
    q, k and v biased as a Qwen2."""
    if config.architecture == "llama":
        return FORMATS["qwen2" if config.attention_biases == "qkv" else "llama"]
    return FORMATS[config.architecture]
