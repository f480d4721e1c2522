"""Each architecture's parameters by name and shape, from its configuration alone (no torch), for
the planner and the memory plan: the root's (embeddings, final norm, untied head) and one block's
(a transformer layer's). The models build exactly these (tests/unit/test_shapes.py checks every
architecture and option against a model built on the meta device).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ParameterShapes", "Rows", "gpt2_shapes", "gpt_neox_shapes", "llama_shapes"]

Shapes = dict[str, tuple[int, ...]]


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
            chunk = -(-rows // self.shards)
            first, last = min(self.rank * chunk, rows), min((self.rank + 1) * chunk, rows)
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
            chunk = -(-len(rows) // self.shards)
            parts.append(rows[self.rank * chunk : (self.rank + 1) * chunk].reshape(-1))
        return torch.cat(parts)

    def indices(self) -> Any:
        """The global flat positions of this rank's entries, in order (a torch tensor)."""
        import torch

        return torch.cat([torch.arange(start, stop) for start, stop in self.spans])


def _linear(name: str, out: int, into: int, bias: bool) -> Shapes:
    return {f"{name}.weight": (out, into), **({f"{name}.bias": (out,)} if bias else {})}


def _norm(name: str, d: int, bias: bool) -> Shapes:
    return {f"{name}.weight": (d,), **({f"{name}.bias": (d,)} if bias else {})}


def _root(config: Any, norm_bias: bool, positions: bool) -> ParameterShapes:
    V, d = config.vocab_size, config.d_model
    root: Shapes = {"tok_embeddings.weight": (V, d)}
    if positions:
        root["pos_embeddings.weight"] = (config.max_seq_len, d)
    root.update(_norm("norm", d, norm_bias))
    if not config.tie_embeddings:
        root["output.weight"] = (V, d)
    by_rows = tuple(k for k in root if k.endswith("embeddings.weight") or k == "output.weight")
    return ParameterShapes(root, {}, config.n_layers, by_rows)


def llama_shapes(config: Any) -> ParameterShapes:
    """RMSNorm, q/k/v/o projections (grouped-query k and v; biases as attention_bias says), SwiGLU."""
    d, f, kv, biases = config.d_model, config.d_ff, config.kv_heads * config.head_dim, config.attention_biases
    block = {
        **_norm("attention_norm", d, False),
        **_linear("attention.wq", d, d, biases != "none"),
        **_linear("attention.wk", kv, d, biases != "none"),
        **_linear("attention.wv", kv, d, biases != "none"),
        **_linear("attention.wo", d, d, biases == "all"),
        **_norm("ffn_norm", d, False),
        **_linear("feed_forward.w1", f, d, config.mlp_biased),
        **_linear("feed_forward.w2", d, f, config.mlp_biased),
        **_linear("feed_forward.w3", f, d, config.mlp_biased),
    }
    root = _root(config, norm_bias=False, positions=False)
    return ParameterShapes(root.root, block, root.blocks, root.by_rows)


def gpt2_shapes(config: Any) -> ParameterShapes:
    """Learned positions, LayerNorm with bias, one fused biased q/k/v projection, a biased GELU MLP."""
    d, f = config.d_model, config.d_ff
    block = {
        **_norm("attention_norm", d, True),
        **_linear("attention.wqkv", 3 * d, d, True),
        **_linear("attention.wo", d, d, True),
        **_norm("ffn_norm", d, True),
        **_linear("feed_forward.w1", f, d, True),
        **_linear("feed_forward.w2", d, f, True),
    }
    root = _root(config, norm_bias=True, positions=True)
    return ParameterShapes(root.root, block, root.blocks, root.by_rows)


def gpt_neox_shapes(config: Any) -> ParameterShapes:
    """LayerNorm with bias, one fused q/k/v projection and the output one (biased unless
    attention_bias is none), a GELU MLP (biased unless mlp_bias is false)."""
    d, f, biased = config.d_model, config.d_ff, config.attention_biases == "all"
    block = {
        **_norm("attention_norm", d, True),
        **_norm("ffn_norm", d, True),
        **_linear("attention.wqkv", 3 * d, d, biased),
        **_linear("attention.wo", d, d, biased),
        **_linear("feed_forward.w1", f, d, config.mlp_biased),
        **_linear("feed_forward.w2", d, f, config.mlp_biased),
    }
    root = _root(config, norm_bias=True, positions=False)
    return ParameterShapes(root.root, block, root.blocks, root.by_rows)
