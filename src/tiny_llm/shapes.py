"""Each architecture's parameter table (:class:`ParameterTable`), declared once without torch: every
parameter's name, shape from the configuration, Hugging Face checkpoint key, transpose and block,
for the root (embeddings, final norm, untied head) and one block (a transformer layer). Shapes for
the planner and the memory plan, the checkpoint key maps (:mod:`tiny_llm.model.hf_formats`) and the
per-block statistics' blocks (:mod:`tiny_llm.curvature.blocks`) are read from it; the models build
exactly these (tests/unit/test_shapes.py checks every architecture and option against a model built
on the meta device). Also where a rank's rows of every parameter-sized vector are (``Rows``, FSDP2's
``Shard(0)`` arithmetic written once in ``shard_span``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GPT2",
    "GPT_NEOX",
    "LLAMA",
    "Parameter",
    "ParameterShapes",
    "ParameterTable",
    "Rows",
    "shard_chunk",
    "shard_span",
]

Shapes = dict[str, tuple[int, ...]]


def shard_chunk(rows: int, shards: int) -> int:
    """Rows of each rank's chunk when ``rows`` rows are cut into ``shards`` (FSDP2's ``Shard(0)``):
    ⌈rows / shards⌉, the last chunks shorter or empty. The one place this arithmetic is written."""
    return -(-rows // shards)


def shard_span(rows: int, rank: int, shards: int) -> tuple[int, int]:
    """Rank ``rank``'s (first, stop) rows of ``rows`` cut into ``shards`` chunks (``shard_chunk``).

    Example:
        >>> shard_span(5, 1, 2), shard_span(5, 2, 3), shard_span(1, 1, 2)
        ((3, 5), (4, 5), (1, 1))
    """
    chunk = shard_chunk(rows, shards)
    return min(rank * chunk, rows), min((rank + 1) * chunk, rows)


@dataclass(frozen=True)
class ParameterShapes:
    """A model's parameters: the root's and each of its ``blocks`` identical blocks' (``layers.i.``
    prefixed in the model); ``by_rows`` names the root parameters read by rows (the embeddings and
    the head: their directions are never gathered whole)."""

    root: Shapes
    block: Shapes
    blocks: int
    by_rows: tuple[str, ...]

    @property
    def count(self) -> int:
        """D, the unique trainable parameters."""
        return self.root_count + self.blocks * self.block_count

    @property
    def root_count(self) -> int:
        return sum(math.prod(s) for s in self.root.values())

    @property
    def block_count(self) -> int:
        return sum(math.prod(s) for s in self.block.values()) if self.blocks else 0

    @property
    def largest_gathered(self) -> int:
        """The largest parameter gathered whole by a sharded pass (every one but ``by_rows``)."""
        sizes = [math.prod(s) for k, s in self.root.items() if k not in self.by_rows]
        sizes += [math.prod(s) for s in self.block.values()] if self.blocks else []
        return max(sizes, default=0)

    def rows(self, rank: int = 0, shards: int = 1, sharded: bool = False) -> Rows:
        """The layout of rank ``rank``'s rows of these parameters (every block's, in the model's
        order of counts; a memory plan asks only counts)."""
        return Rows(tuple(self.root.values()) + tuple(self.block.values()) * self.blocks, rank, shards, sharded)


@dataclass(frozen=True)
class Rows:
    """Which entries of every parameter-sized vector a rank holds, from the parameters' shapes alone:
    every parameter (in ``shapes``' order, flattened row-major) cut along its first axis into
    ``shards`` chunks of ⌈rows / shards⌉ rows, the last ones shorter or empty (FSDP2's
    ``Shard(0)``); unsharded (``shards`` 1), every entry. ``sharded``: the job's model is sharded
    (FSDP2), over one rank or several. The one layout of a job: the operator's placement, the
    vectors a worker cuts (the consensus errors, the step Δ) and the memory plan's counts.

    Example:
        >>> rows = Rows(((5, 2), (3,)), rank=1, shards=2, sharded=True)
        >>> rows.D, rows.held, rows.spans
        (13, 5, ((6, 10), (12, 13)))
    """

    shapes: tuple[Sequence[int], ...]
    rank: int = 0
    shards: int = 1
    sharded: bool = False

    @property
    def D(self) -> int:
        """Entries of a whole parameter-sized vector."""
        return sum(math.prod(s) for s in self.shapes)

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        """This rank's entries of each parameter as global flat (start, stop) positions."""
        spans, offset = [], 0
        for shape in self.shapes:
            rows, per_row = (shape[0], math.prod(shape[1:])) if len(shape) else (1, 1)
            first, last = shard_span(rows, self.rank, self.shards)
            spans.append((offset + first * per_row, offset + last * per_row))
            offset += rows * per_row
        return tuple(spans)

    @property
    def held(self) -> int:
        """Entries this rank holds of a parameter-sized vector (rank 0 holds the most)."""
        return sum(stop - start for start, stop in self.spans)

    def cut(self, tensors: Sequence[Any]) -> Any:
        """This rank's entries (in order) of a parameter-sized vector given whole, one tensor per
        parameter in ``shapes``' order (a checkpoint's, say): each tensor's rows of this rank,
        flattened and concatenated; nothing else is copied."""
        import torch

        parts = []
        for tensor in tensors:
            rows = tensor.reshape(-1, *tensor.shape[1:]) if tensor.dim() else tensor.reshape(1)
            first, last = shard_span(len(rows), self.rank, self.shards)
            parts.append(rows[first:last].reshape(-1))
        return torch.cat(parts)

    def indices(self) -> Any:
        """The global flat positions of this rank's entries, in order (a torch tensor)."""
        import torch

        return torch.cat([torch.arange(start, stop) for start, stop in self.spans])


def _always(config: Any) -> bool:
    return True


def _untied(config: Any) -> bool:
    return not config.tie_embeddings


@dataclass(frozen=True)
class Parameter:
    """One parameter of an architecture: our name (inside ``layers.<i>.`` for a block's), its shape
    from the configuration, the Hugging Face checkpoint's key (inside the format's layer prefix for
    a block's), whether that checkpoint stores it transposed (GPT-2's ``Conv1D``: (in, out)), its
    block of the per-block statistics (``embedding``, ``attention``, ``mlp``, ``norms``, ``head``)
    and when a configuration has it."""

    name: str
    shape: Callable[[Any], tuple[int, ...]]
    theirs: str
    block: str
    present: Callable[[Any], bool] = _always
    transposed: bool = False


def _linear(name: str, theirs: str, block: str, out: Callable, into: Callable, bias: Callable, transposed=False):
    """A linear map's weight (out, into) and its bias (out,) where ``bias(config)``."""
    return (
        Parameter(f"{name}.weight", lambda c: (out(c), into(c)), f"{theirs}.weight", block, transposed=transposed),
        Parameter(f"{name}.bias", lambda c: (out(c),), f"{theirs}.bias", block, bias),
    )


def _norm(name: str, theirs: str, bias: bool, block: str = "norms") -> tuple[Parameter, ...]:
    weight = Parameter(f"{name}.weight", lambda c: (c.d_model,), f"{theirs}.weight", block)
    return (weight, Parameter(f"{name}.bias", lambda c: (c.d_model,), f"{theirs}.bias", block)) if bias else (weight,)


@dataclass(frozen=True)
class ParameterTable:
    """An architecture's parameters, the one declaration of them: the root's (embeddings, final
    norm, untied head) and one block's (a transformer layer's), each a ``Parameter`` in the model's
    order. Its shapes for the planner and the memory plan, the Hugging Face key maps of its import
    and export, the transposed keys and the parameters' blocks are all read from it
    (tests/unit/test_shapes.py builds every architecture on the meta device against it)."""

    root: tuple[Parameter, ...]
    block: tuple[Parameter, ...]

    def shapes(self, config: Any) -> ParameterShapes:
        """The parameters a model of ``config`` has, by name and shape."""
        root = {p.name: p.shape(config) for p in self.root if p.present(config)}
        block = {p.name: p.shape(config) for p in self.block if p.present(config)}
        by_rows = tuple(k for k in root if k.endswith("embeddings.weight") or k == "output.weight")
        return ParameterShapes(root, block, config.n_layers, by_rows)

    def root_keys(self) -> dict[str, str]:
        """Our keys outside the layers → the checkpoint's."""
        return {p.name: p.theirs for p in self.root}

    def layer_keys(self) -> dict[str, str]:
        """Our keys inside ``layers.<i>.`` → the checkpoint's inside its layer prefix."""
        return {p.name: p.theirs for p in self.block}

    def transposed(self) -> frozenset[str]:
        """Block keys the checkpoint stores transposed."""
        return frozenset(p.name for p in self.block if p.transposed)

    def blocks(self) -> dict[str, str]:
        """Each of our keys (a block's without its ``layers.<i>.``) → its block."""
        return {p.name: p.block for p in self.root + self.block}


def _root(embeddings: str, positions: str | None, norm: tuple[Parameter, ...], head: str) -> tuple[Parameter, ...]:
    table = (Parameter("tok_embeddings.weight", lambda c: (c.vocab_size, c.d_model), embeddings, "embedding"),)
    if positions is not None:
        table += (Parameter("pos_embeddings.weight", lambda c: (c.max_seq_len, c.d_model), positions, "embedding"),)
    head_weight = Parameter("output.weight", lambda c: (c.vocab_size, c.d_model), head, "head", _untied)
    return table + norm + (head_weight,)


def _d(c: Any) -> int:
    return c.d_model


def _f(c: Any) -> int:
    return c.d_ff


def _kv(c: Any) -> int:
    return c.kv_heads * c.head_dim


def _qkv_biased(c: Any) -> bool:
    return c.attention_biases != "none"


def _all_biased(c: Any) -> bool:
    return c.attention_biases == "all"


def _mlp_biased(c: Any) -> bool:
    return c.mlp_biased


LLAMA = ParameterTable(
    root=_root("model.embed_tokens.weight", None, _norm("norm", "model.norm", False), "lm_head.weight"),
    block=(
        *_norm("attention_norm", "input_layernorm", False),
        *_linear("attention.wq", "self_attn.q_proj", "attention", _d, _d, _qkv_biased),
        *_linear("attention.wk", "self_attn.k_proj", "attention", _kv, _d, _qkv_biased),
        *_linear("attention.wv", "self_attn.v_proj", "attention", _kv, _d, _qkv_biased),
        *_linear("attention.wo", "self_attn.o_proj", "attention", _d, _d, _all_biased),
        *_norm("ffn_norm", "post_attention_layernorm", False),
        *_linear("feed_forward.w1", "mlp.gate_proj", "mlp", _f, _d, _mlp_biased),  # silu(w1 x) * w3 x: the gate
        *_linear("feed_forward.w2", "mlp.down_proj", "mlp", _d, _f, _mlp_biased),
        *_linear("feed_forward.w3", "mlp.up_proj", "mlp", _f, _d, _mlp_biased),
    ),
)
"""RMSNorm, q/k/v/o projections (grouped-query k and v; biases as attention_bias says), SwiGLU;
Hugging Face's Llama family (Mistral, Qwen2)."""


def _three_d(c: Any) -> int:
    return 3 * c.d_model


GPT2 = ParameterTable(
    root=_root(
        "transformer.wte.weight", "transformer.wpe.weight", _norm("norm", "transformer.ln_f", True), "lm_head.weight"
    ),
    block=(
        *_norm("attention_norm", "ln_1", True),
        *_linear("attention.wqkv", "attn.c_attn", "attention", _three_d, _d, _always, transposed=True),
        *_linear("attention.wo", "attn.c_proj", "attention", _d, _d, _always, transposed=True),
        *_norm("ffn_norm", "ln_2", True),
        *_linear("feed_forward.w1", "mlp.c_fc", "mlp", _f, _d, _always, transposed=True),
        *_linear("feed_forward.w2", "mlp.c_proj", "mlp", _d, _f, _always, transposed=True),
    ),
)
"""Learned positions, LayerNorm with bias, one fused biased q/k/v projection, a biased GELU MLP
(Hugging Face's GPT-2 stores its projections transposed)."""

GPT_NEOX = ParameterTable(
    root=_root("gpt_neox.embed_in.weight", None, _norm("norm", "gpt_neox.final_layer_norm", True), "embed_out.weight"),
    block=(
        *_norm("attention_norm", "input_layernorm", True),
        *_norm("ffn_norm", "post_attention_layernorm", True),
        *_linear("attention.wqkv", "attention.query_key_value", "attention", _three_d, _d, _all_biased),
        *_linear("attention.wo", "attention.dense", "attention", _d, _d, _all_biased),
        *_linear("feed_forward.w1", "mlp.dense_h_to_4h", "mlp", _f, _d, _mlp_biased),
        *_linear("feed_forward.w2", "mlp.dense_4h_to_h", "mlp", _d, _f, _mlp_biased),
    ),
)
"""LayerNorm with bias, one fused q/k/v projection and the output one (biased unless
attention_bias is none), a GELU MLP (biased unless mlp_bias is false)."""
