"""Hugging Face Llama-family (``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``),
``GPT2LMHeadModel`` and ``GPTNeoXForCausalLM`` directories in and out of our Llama, GPT-2 and
GPT-NeoX, exactly.

One literal key map per architecture, written once (:mod:`tiny_llm.model.hf_formats`).

Only local directories are read (``config.json`` and ``model.safetensors`` or a sharded
``model.safetensors.index.json``, else ``pytorch_model.bin``, single or sharded, read as tensors
only with ``torch.load(weights_only=True)``: a pickle that would run code is refused by name and
never executed; checkpoints are data, not code); a hub id is refused with how to fetch it first (a
revision in the local cache resolves through :mod:`tiny_llm.model.hub`). A configuration our
models cannot represent is refused by name (Llama family: a sliding window shorter than the context,
another activation, RoPE scaling other than linear or llama3, a head size other than
d_model / n_heads; GPT-2: another activation, unscaled or layer-scaled attention, cross-attention;
GPT-NeoX: another activation).

``transformers`` is not needed here; the tests check both directions against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiny_llm.config import ModelConfig, RunConfig, config_from_dict, config_to_dict
from tiny_llm.io import atomic_directory, local_directory
from tiny_llm.layout import IMPORTED
from tiny_llm.model.hf_formats import (
    FORMATS,
    GPT2_LAYER_KEYS,
    GPT2_MODEL_KEYS,
    LLAMA_LAYER_KEYS,
    LLAMA_MODEL_KEYS,
    export_format,
    refusal,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "FORMATS",
    "GPT2_LAYER_KEYS",
    "GPT2_MODEL_KEYS",
    "HF_CONFIG",
    "IMPORTED",
    "LLAMA_LAYER_KEYS",
    "LLAMA_MODEL_KEYS",
    "adapter_config",
    "from_hf_state",
    "imported_config",
    "model_config_from_hf",
    "model_config_to_hf",
    "read_hf",
    "read_json_object",
    "read_weights",
    "to_hf_state",
    "weight_files",
    "write_hf",
    "write_hf_files",
]


def to_hf_state(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict -> the Hugging Face model's (the same tensors renamed; GPT-2's Conv1D
    weights transposed)."""
    form = export_format(config)
    return {form.theirs(key): tensor.t() if form.flips(key) else tensor for key, tensor in state.items()}


def our_names(config: ModelConfig) -> dict[str, str]:
    """Each of our parameters' names by its Hugging Face name, for ``config``."""
    form = export_format(config)
    return {form.theirs(key): key for key in _parameter_shapes(config)}


def from_hf_state(hf_state: dict[str, torch.Tensor], config: ModelConfig, source: str) -> dict[str, torch.Tensor]:
    """The Hugging Face model's state dict -> ours, for ``config``; a tied head's ``lm_head.weight``
    (when saved at all) must equal the embedding.

    Raises:
        ValueError: naming ``source`` and the keys that are missing or have no counterpart.
    """
    form = export_format(config)
    ours, theirs = _parameter_shapes(config), our_names(config)
    embedding, head = form.model_keys["tok_embeddings.weight"], form.model_keys["output.weight"]
    state, unknown = {}, []
    for key, tensor in hf_state.items():
        if key == head and config.tie_embeddings:
            if not tensor.equal(hf_state.get(embedding, tensor)):
                raise ValueError(f"{source}: tie_word_embeddings is true but {head} differs from the embedding")
            continue
        if form.derived.fullmatch(key):
            continue
        if key not in theirs:
            unknown.append(key)
            continue
        state[theirs[key]] = tensor.t().contiguous() if form.flips(theirs[key]) else tensor
        if tuple(state[theirs[key]].shape) != ours[theirs[key]]:
            want = ours[theirs[key]][::-1] if form.flips(theirs[key]) else ours[theirs[key]]
            raise ValueError(
                f"{source}: {key} has shape {list(tensor.shape)}, but its config.json gives {list(want)}"
                f"{_sizes_named(config, set(want) - set(tensor.shape))}; the weights are not those of this "
                "config.json (save the model again)"
            )
    missing = sorted(set(ours) - set(state))
    if unknown or missing:
        raise ValueError(
            f"{source}: weights do not match a {form.hf_class} of config.json"
            + (f"; unknown {unknown[:4]}" if unknown else "")
            + (f"; missing {missing[:4]}" if missing else "")
        )
    return state


def _sizes_named(config: ModelConfig, dims: set[int]) -> str:
    """`` (vocab_size 308)``: the config.json keys whose sizes a mismatched shape was expected to have."""
    from tiny_llm.model.hf_formats import GPT2_KEYS, GPT_NEOX_KEYS, LLAMA_KEYS

    keys = {"gpt2": GPT2_KEYS, "gpt_neox": GPT_NEOX_KEYS}.get(config.architecture, LLAMA_KEYS)
    named = [f"{keys[f]} {getattr(config, f)}" for f in ("vocab_size", "d_model", "d_ff") if getattr(config, f) in dims]
    return f" ({', '.join(named)})" if named else ""


def _parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The state-dict keys of our model for ``config`` and their shapes, from a model built
    without storage."""
    import torch

    from tiny_llm.architectures import build_model

    with torch.device("meta"):
        return {key: tuple(tensor.shape) for key, tensor in build_model(config).state_dict().items()}


def model_config_from_hf(data: dict[str, Any], source: str) -> ModelConfig:
    """Our ModelConfig from a Llama-family, GPT-2 or GPT-NeoX config.json.

    Raises:
        ValueError: another model type, or a configuration our models cannot represent, naming the
            key and ``source``.
    """
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in FORMATS:
        raise refusal(source)(
            "model_type",
            model_type,
            f"only {', '.join(FORMATS)} convert to this project's "
            "models; tiny-llm import-hf brings any other causal LM in as it is, measured through "
            "the adapter with the HVP engines",
        )
    try:
        return FORMATS[model_type].config_from(data, source)
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"{source}: key {error} is missing or malformed; not a complete {model_type} "
            "config.json (save the model again)"
        ) from None
    except ValueError as error:
        raise ValueError(str(error) if str(error).startswith(source) else f"{source}: {error}") from None


def model_config_to_hf(config: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The Hugging Face config.json for our ModelConfig."""
    form = export_format(config)
    return {
        "architectures": [form.hf_class],
        "model_type": form.model_type,
        **form.config_to(config),
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object.

    Raises:
        ValueError: naming the file: unreadable, not JSON (truncated, say) or not an object.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} cannot be read ({error})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); is it truncated? save it again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object; save it again")
    return data


def _read_config(directory: str | Path) -> tuple[Path, dict[str, Any]]:
    """A local Hugging Face model directory and its config.json."""
    path = local_directory(directory)
    if not (path / "config.json").exists():
        raise ValueError(f"{path} has no config.json; give a Hugging Face model directory")
    return path, read_json_object(path / "config.json")


WEIGHT_FILES = (
    ("model.safetensors.index.json", "model.safetensors"),
    ("pytorch_model.bin.index.json", "pytorch_model.bin"),
)
"""A directory's weights, in order of preference: safetensors (one file or sharded with its index),
then PyTorch's pickled ``.bin`` (read as tensors only, never as code)."""


def weight_files(path: Path) -> list[str]:
    """A Hugging Face model directory's weight files: safetensors, else ``pytorch_model.bin``
    (single or sharded with its index)."""
    for index_name, single in WEIGHT_FILES:
        index = path / index_name
        if index.exists():
            weight_map = read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index} has no weight_map; save the model again")
            files = sorted(set(weight_map.values()))
            for file in files:
                if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
                    raise ValueError(
                        f"{index}: its weight_map names {file!r}, not a file of {path}; a checkpoint's shards are "
                        "files of its own folder (save the model again)"
                    )
            return files
        if (path / single).exists():
            return [single]
    raise ValueError(f"{path} has no model.safetensors or pytorch_model.bin")


def _load_pickled(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a pickled ``.bin`` file, checked and read as tensors only
    (:func:`tiny_llm.model.pickles.load_pickle`): a pickle that would run code is refused by name and
    never executed."""
    import torch

    from tiny_llm.model.pickles import load_pickle

    state = load_pickle(file, mmap=True)
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ValueError(f"{file} holds no state dict of tensors; not a model's weights")
    return state


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A Hugging Face model directory's weights (safetensors, else ``pytorch_model.bin``), as saved
    (their stored dtype kept).

    Raises:
        ValueError: no weights, a missing, truncated or corrupt file, or a pickle carrying code, named.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    hf_state: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        if file.endswith(".bin"):
            hf_state.update(_load_pickled(path / file))
            continue
        try:
            hf_state.update(load_file(path / file))
        except (SafetensorError, OSError, ValueError) as error:
            raise ValueError(f"{path / file} is truncated or corrupt ({error}); save or download it again") from None
    return hf_state


def read_hf(directory: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Our ModelConfig and state dict from a local Llama-family, GPT-2 or GPT-NeoX directory.

    Raises:
        ValueError: a hub id or missing directory, pickled weights, or a configuration or weights
            our models cannot represent, each naming what to do.
    """
    path, data = _read_config(directory)
    config = model_config_from_hf(data, str(path / "config.json"))
    return config, from_hf_state(read_weights(path), config, str(path))


HF_CONFIG = "hf-config.json"
"""An imported run's copy of the config.json of a model of another architecture (``hf``)."""


def adapter_config(data: dict[str, Any], hf_config: Path) -> ModelConfig:
    """ModelConfig ``architecture: hf`` for a config.json of another causal LM: its shape read from
    the usual keys (for the memory model and the vocabulary check)."""

    def first(*keys: str, default: Any = None) -> Any:
        return next((data[k] for k in keys if data.get(k) is not None), default)

    width = first("hidden_size", "n_embd", "d_model")
    if width is None or first("vocab_size") is None:
        raise ValueError(f"{hf_config}: no hidden_size or vocab_size; not a causal language model config.json")
    return ModelConfig(
        architecture="hf",
        hf_config=str(hf_config),
        vocab_size=data["vocab_size"],
        d_model=width,
        n_layers=first("num_hidden_layers", "n_layer", "num_layers", default=1),
        n_heads=first("num_attention_heads", "n_head", default=1),
        d_ff=first("intermediate_size", "n_inner", "ffn_dim", default=None) or 4 * width,
        max_seq_len=first("max_position_embeddings", "n_positions", "max_seq_len", default=2048),
        tie_embeddings=bool(data.get("tie_word_embeddings", True)),
    )


def write_hf(out: str | Path, config: ModelConfig, state: dict[str, torch.Tensor]) -> Path:
    """Write a Hugging Face directory (config.json, model.safetensors) for ``config``'s
    architecture atomically: a
    temporary folder renamed onto ``out``, which must not exist yet.

    Raises:
        ValueError: ``out`` exists.
    """
    out = Path(out)
    if out.exists():
        raise ValueError(f"{out} exists; choose a new directory (nothing is overwritten)")
    with atomic_directory(out) as tmp:
        write_hf_files(tmp, config, state)
    return out


def write_hf_files(directory: Path, config: ModelConfig, state: dict[str, torch.Tensor]) -> None:
    """config.json and model.safetensors of ``config``'s architecture into an existing ``directory``."""
    from safetensors.torch import save_file

    tensors = {k: t.detach().to("cpu").contiguous() for k, t in to_hf_state(state, config).items()}
    dtype = next(iter(tensors.values())).dtype
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(model_config_to_hf(config, dtype), indent=2) + "\n")


def imported_config(directories: list[str | Path], config: RunConfig, adapter: bool = False) -> RunConfig:
    """The run configuration importing ``directories`` gives (before anything is written): the model
    section from their config.json, which must agree (dtype aside), data and training from
    ``config``. For another architecture (or any, with ``adapter``) ``model.hf_config`` names the
    first directory's config.json (the import then points it at the run's copy).

    Raises:
        ValueError: a missing directory or config.json, disagreeing configurations, or one our
            models cannot represent.
    """
    paths = [Path(d) for d in directories]
    read = [_read_config(path) for path in paths]

    def essential(data: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in data.items() if k not in ("torch_dtype", "dtype", "transformers_version")}

    for path, data in read[1:]:
        if essential(data) != essential(read[0][1]):
            mine, first = essential(data), essential(read[0][1])
            keys = sorted(k for k in set(mine) | set(first) if mine.get(k) != first.get(k))
            raise ValueError(
                f"{path / 'config.json'} differs from {paths[0] / 'config.json'} (in {', '.join(keys[:3])}); "
                "import the checkpoints of one model configuration into one run directory"
            )
    data = read[0][1]
    if not isinstance(data.get("model_type"), str) or not data["model_type"]:
        raise ValueError(
            f"{paths[0] / 'config.json'}: model_type={data.get('model_type')!r}: no model type, so neither this "
            "project's models nor transformers can build it; save the model again with its config.json"
        )
    if data.get("model_type") in FORMATS and not adapter:
        model = model_config_from_hf(data, str(paths[0] / "config.json"))
    else:
        try:
            model = adapter_config(data, paths[0] / "config.json")
        except (TypeError, ValueError) as error:
            raise ValueError(
                str(error) if str(paths[0]) in str(error) else f"{paths[0] / 'config.json'}: {error}"
            ) from None
    return config_from_dict({**config_to_dict(config), "model": config_to_dict(model)})
