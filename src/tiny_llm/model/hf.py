"""Hugging Face ``LlamaForCausalLM`` directories in and out of our Llama, exactly.

One literal key map, written once (``LAYER_KEYS``, ``MODEL_KEYS``). No tensor is permuted: our
RoPE rotates the two halves of each head's features (``apply_rope``), which is the layout of
``transformers``' ``LlamaForCausalLM`` (its ``rotate_half``); the permutation that Meta's
original checkpoints need (interleaved pairs to halves) is applied by ``transformers``' own
conversion script, before a checkpoint reaches this format. The projections are stored as
(out, in) in both.

Only local directories are read (``config.json`` and ``model.safetensors`` or a sharded
``model.safetensors.index.json``); a hub id is refused with how to fetch it first, and pickled
``pytorch_model.bin`` weights are refused (checkpoints are data, not code). A configuration our
Llama cannot represent is refused by name: grouped-query attention, biases, another activation,
RoPE scaling, a head size other than d_model / n_heads.

``transformers`` is not needed here; the tests check both directions against it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tiny_llm.config import ModelConfig, RunConfig, config_from_dict, config_to_dict, dump_config, load_config
from tiny_llm.io import atomic_directory, atomic_write_json, atomic_write_text

__all__ = ["IMPORTED", "LAYER_KEYS", "MODEL_KEYS", "export_run", "from_hf_state", "import_run", "model_config_from_hf",
           "model_config_to_hf", "read_hf", "to_hf_state", "write_hf"]

IMPORTED = "imported.json"
"""Marks a run directory made by ``import_run``: training refuses it (it would overwrite the weights)."""

LAYER_KEYS = {
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
"""Our key inside ``layers.{i}.`` -> theirs inside ``model.layers.{i}.``."""
MODEL_KEYS = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
"""Our keys outside the layers -> theirs (``output.weight`` only for an untied head)."""

_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def _hf_key(key: str) -> str:
    if key in MODEL_KEYS:
        return MODEL_KEYS[key]
    match = _LAYER.fullmatch(key)
    if match and match.group(2) in LAYER_KEYS:
        return f"model.layers.{match.group(1)}.{LAYER_KEYS[match.group(2)]}"
    raise ValueError(f"parameter {key} has no Hugging Face Llama counterpart")


def to_hf_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> ``LlamaForCausalLM``'s (the same tensors, renamed)."""
    return {_hf_key(key): tensor for key, tensor in state.items()}


def from_hf_state(hf_state: dict[str, torch.Tensor], config: ModelConfig, source: str) -> dict[str, torch.Tensor]:
    """``LlamaForCausalLM``'s state dict -> ours, for ``config``; a tied head's ``lm_head.weight``
    (when saved at all) must equal the embedding.

    Raises:
        ValueError: naming ``source`` and the keys that are missing or have no counterpart.
    """
    theirs = {hf: ours for ours, hf in MODEL_KEYS.items()}
    theirs.update({f"model.layers.{i}.{hf}": f"layers.{i}.{ours}"
                   for i in range(config.n_layers) for ours, hf in LAYER_KEYS.items()})
    state, unknown = {}, []
    for key, tensor in hf_state.items():
        if key == "lm_head.weight" and config.tie_embeddings:
            if not torch.equal(tensor, hf_state.get("model.embed_tokens.weight", tensor)):
                raise ValueError(f"{source}: tie_word_embeddings is true but lm_head.weight differs from the embedding")
            continue
        if key.endswith("rotary_emb.inv_freq"):  # a buffer some versions saved: derived from rope_theta
            continue
        if key not in theirs:
            unknown.append(key)
            continue
        state[theirs[key]] = tensor
    expected = {theirs[k] for k in theirs if not (k == "lm_head.weight" and config.tie_embeddings)}
    missing = sorted(expected - set(state))
    if unknown or missing:
        raise ValueError(f"{source}: weights do not match a Llama of config.json"
                         + (f"; unknown {unknown[:4]}" if unknown else "") + (f"; missing {missing[:4]}" if missing else ""))
    return state


def model_config_from_hf(data: dict[str, Any], source: str) -> ModelConfig:
    """Our ModelConfig from a ``LlamaForCausalLM`` config.json.

    Raises:
        ValueError: a configuration our Llama cannot represent, naming the key and ``source``.
    """
    def refuse(key: str, found: Any, need: str) -> ValueError:
        return ValueError(f"{source}: {key}={found!r} cannot be represented here ({need})")
    if data.get("model_type") != "llama":
        raise refuse("model_type", data.get("model_type"), "only llama converts exactly; other causal LMs are "
                     "analysed through the adapter with the HVP engines")
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
    return ModelConfig(vocab_size=data["vocab_size"], d_model=data["hidden_size"], n_layers=data["num_hidden_layers"],
                       n_heads=heads, d_ff=data["intermediate_size"], max_seq_len=data["max_position_embeddings"],
                       rope_theta=float(data.get("rope_theta") or rope.get("rope_theta", 10000.0)),
                       norm_eps=float(data["rms_norm_eps"]), tie_embeddings=bool(data.get("tie_word_embeddings", True)))


def model_config_to_hf(config: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """A ``LlamaForCausalLM`` config.json for our ModelConfig (``rope_theta`` both where
    transformers 4 and 5 read it)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": config.vocab_size,
            "hidden_size": config.d_model, "num_hidden_layers": config.n_layers,
            "num_attention_heads": config.n_heads, "num_key_value_heads": config.n_heads,
            "head_dim": config.head_dim, "intermediate_size": config.d_ff,
            "max_position_embeddings": config.max_seq_len, "rms_norm_eps": config.norm_eps,
            "rope_theta": config.rope_theta, "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": config.tie_embeddings, "torch_dtype": str(dtype).removeprefix("torch.")}


def read_hf(directory: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our ModelConfig and state dict from a local ``LlamaForCausalLM`` directory.

    Raises:
        ValueError: a hub id or missing directory, pickled weights, or a configuration or weights
            our Llama cannot represent, each naming what to do.
    """
    path = Path(directory)
    if not path.is_dir():
        hint = (f"; it looks like a hub id: fetch it first (huggingface-cli download {directory} --local-dir DIR) "
                "and give DIR" if re.fullmatch(r"[\w.-]+/[\w.-]+", str(directory)) else "")
        raise ValueError(f"{directory} is not a local directory{hint}")
    if not (path / "config.json").exists():
        raise ValueError(f"{path} has no config.json; give a Hugging Face model directory")
    config = model_config_from_hf(json.loads((path / "config.json").read_text()), str(path / "config.json"))
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    elif any(path.glob("*.bin")):
        raise ValueError(f"{path} holds pickled .bin weights only; convert them to safetensors first "
                         "(model.save_pretrained(DIR, safe_serialization=True))")
    else:
        raise ValueError(f"{path} has no model.safetensors")
    hf_state: dict[str, torch.Tensor] = {}
    for file in files:
        hf_state.update(load_file(path / file))
    return config, from_hf_state(hf_state, config, str(path))


def write_hf(out: str | Path, config: ModelConfig, state: dict[str, torch.Tensor]) -> Path:
    """Write a ``LlamaForCausalLM`` directory (config.json, model.safetensors) atomically: a
    temporary folder renamed onto ``out``, which must not exist yet.

    Raises:
        ValueError: ``out`` exists.
    """
    out = Path(out)
    if out.exists():
        raise ValueError(f"{out} exists; choose a new directory (nothing is overwritten)")
    with atomic_directory(out) as tmp:
        tensors = {k: t.detach().to("cpu").contiguous() for k, t in to_hf_state(state).items()}
        dtype = next(iter(tensors.values())).dtype
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(model_config_to_hf(config, dtype), indent=2) + "\n")
    return out


def import_run(directory: str | Path, run_dir: str | Path, config: RunConfig, step: int = 0, tokens: int = 0) -> Path:
    """Make a run directory from a local ``LlamaForCausalLM`` directory: ``resolved.yaml`` (the
    model section from its config.json, data and training from ``config``), the weights as
    ``epoch-000.safetensors`` (metadata step and tokens as given) and ``imported.json``.

    Raises:
        ValueError: anything :func:`read_hf` refuses, or ``run_dir`` exists and is not empty.
    """
    from tiny_llm.io import sha256_file
    from tiny_llm.model.checkpoint import save_weights

    run_dir, directory = Path(run_dir), Path(directory)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(f"{run_dir} exists and is not empty; import into a new run directory")
    model_config, state = read_hf(directory)
    resolved = config_from_dict({**config_to_dict(config), "model": config_to_dict(model_config)})
    run_dir.mkdir(parents=True, exist_ok=True)
    save_weights(run_dir / "epoch-000.safetensors", state, {"step": step, "tokens": tokens, "epoch": 0})
    atomic_write_text(run_dir / "resolved.yaml", dump_config(resolved))
    files = sorted(p for p in directory.iterdir() if p.suffix in (".json", ".safetensors"))
    atomic_write_json(run_dir / IMPORTED, {"source": str(directory.resolve()), "step": step, "tokens": tokens,
                                           "files": {p.name: sha256_file(p) for p in files}})
    return run_dir


def export_run(run_dir: str | Path, checkpoint: str, out: str | Path) -> Path:
    """Write a run's checkpoint (``epoch-NNN.safetensors`` or ``final.pt``) as a
    ``LlamaForCausalLM`` directory, in the checkpoint's dtype.

    Raises:
        ValueError: an unreadable or mismatched checkpoint, or ``out`` exists.
    """
    from tiny_llm.model.checkpoint import check_state_dict, load_weights
    from tiny_llm.model.llama import Llama

    run_dir = Path(run_dir)
    config = load_config(run_dir / "resolved.yaml")
    state, _ = load_weights(run_dir / checkpoint)
    check_state_dict(Llama(config.model, attention_backend="reference"), state, str(run_dir / checkpoint))
    return write_hf(out, config.model, state)
