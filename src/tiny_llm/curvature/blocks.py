"""Parameter blocks: the parts of a model that the per-block statistics resolve.

A block is the embedding (token and position embeddings; with a tied head, the head too), each
layer's attention, each layer's MLP, the normalisations (every norm's weights and biases, one
block) and an untied output head, in that order. A parameter of no such block (an adapter's
model of another layout) is never filed under a made-up one: per-block curvature of such a model
is refused (:func:`check_block_layout`), and without it the model has no per-block rows. Blocks
partition the parameters, so a vector's squared block norms add up to its squared norm.

The project's architectures declare each parameter's block in their parameter tables
(:class:`tiny_llm.shapes.ParameterTable`), which are read first; other names (an adapter's model,
Hugging Face's ``model.layers.<i>.self_attn``, ``gpt_neox.layers.<i>.mlp``, ``transformer.h.<i>.attn``,
``*layernorm``, ``ln_f``, ``lm_head``, ``embed_out``) are classified by pattern into the same blocks.
Torch-free, but for :func:`squared_norms`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from tiny_llm.architectures import ARCHITECTURES

__all__ = [
    "HEAD",
    "NORMS",
    "block_count",
    "block_of",
    "check_block_layout",
    "model_blocks",
    "parameter_blocks",
    "squared_norms",
]

EMBEDDING, NORMS, HEAD = "embedding", "norms", "head"

_TABLES = [a.parameters for a in ARCHITECTURES.values() if a.parameters is not None]
_ROOT = {p.name: p.block for table in _TABLES for p in table.root}
"""Our architectures' root parameters → their declared block."""
_BLOCK = {p.name: p.block for table in _TABLES for p in table.block}
"""Our architectures' block parameters (without ``layers.<i>.``) → their declared part of a layer."""
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")
_NORM = re.compile(r"norm|(?:^|\.)ln_")
_HEAD = re.compile(r"(?:^|\.)(?:output|lm_head|embed_out)\.")
_EMBEDDING = re.compile(r"embed|(?:^|\.)(?:wte|wpe)\.")
_ATTENTION = re.compile(r"attn|attention")


def block_of(name: str) -> str | None:
    """The block of parameter ``name``: ``embedding``, ``layer <i> attention``, ``layer <i> mlp``,
    ``norms`` or ``head``; None for a parameter of no such block.

    Example:
        >>> [block_of(n) for n in ("tok_embeddings.weight", "layers.0.attention.wq.weight",
        ...  "layers.0.ffn_norm.weight", "layers.1.feed_forward.w2.bias", "output.weight")]
        ['embedding', 'layer 0 attention', 'norms', 'layer 1 mlp', 'head']
    """
    layer = _LAYER.search(name)
    if layer and name.startswith("layers.") and name[layer.end() :] in _BLOCK:
        part = _BLOCK[name[layer.end() :]]
        return f"layer {layer.group(1)} {part}" if part in ("attention", "mlp") else part
    if name in _ROOT:
        return _ROOT[name]
    if _NORM.search(name):
        return NORMS
    if _HEAD.search(name):
        return HEAD
    if layer:
        return f"layer {layer.group(1)} {'attention' if _ATTENTION.search(name) else 'mlp'}"
    if _EMBEDDING.search(name):
        return EMBEDDING
    return None


def check_block_layout(names: Sequence[str]) -> None:
    """Per-block statistics need every parameter in a block this module knows: refuse a model of
    another layout (an adapter's), naming the parameters of no known block.

    Raises:
        ValueError: naming the first such parameters and what to do.
    """
    unknown = [name for name in names if block_of(name) is None]
    if unknown:
        raise ValueError(
            f"block_curvature: {len(unknown)} parameters of this model are of no block this project knows "
            f"(embedding, layer attention or MLP, norms, head): {', '.join(unknown[:3])}"
            f"{', ...' if len(unknown) > 3 else ''}; analyse it without block_curvature"
        )


def block_count(n_layers: int, tie_embeddings: bool) -> int:
    """How many blocks a model of this project's architectures has: the embedding, attention and
    MLP per layer, the norms, and the head when untied (the plan's count of block forms)."""
    return 2 + 2 * n_layers + (0 if tie_embeddings else 1)


def parameter_blocks(names: Sequence[str]) -> list[tuple[str, list[int]]]:
    """The blocks of a model's parameters (``names`` in the flat vector's order), in reading order
    (embedding, layer by layer attention then MLP, norms, head), each with the indices of its
    parameters; blocks without parameters are left out.

    Raises:
        ValueError: a parameter of no known block (:func:`check_block_layout`).
    """
    check_block_layout(names)
    members: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        members.setdefault(block_of(name), []).append(index)

    def order(block: str) -> tuple[int, int, int]:
        if block.startswith("layer "):
            _, number, part = block.split()
            return (1, int(number), part != "attention")
        return ({EMBEDDING: 0, NORMS: 2, HEAD: 3}[block], 0, 0)

    return [(block, members[block]) for block in sorted(members, key=order)]


def model_blocks(
    names: Sequence[str], block_curvature: bool, say: Callable[[str], None]
) -> list[tuple[str, list[int]]]:
    """The blocks a measurement resolves (:func:`parameter_blocks`): with ``block_curvature`` a
    layout of unknown parameters is refused; without it such a model has no per-block rows, and
    ``say`` tells why (its parameters are filed under no made-up block)."""
    if not block_curvature and any(block_of(name) is None for name in names):
        say("per-block statistics left out: this model has parameters of no block this project knows")
        return []
    return parameter_blocks(names)


def squared_norms(parts: Sequence[Any], blocks: list[tuple[str, list[int]]]) -> list[float]:
    """Each block's squared norm of a vector given by its per-parameter parts (tensors in the
    flat vector's order, e.g. ``FlatParameters.blocks(v)``), summed in float64."""
    per_parameter = [float(p.double().pow(2).sum()) for p in parts]
    return [sum(per_parameter[i] for i in indices) for _, indices in blocks]
