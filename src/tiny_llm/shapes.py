"""Each architecture's parameters by name and shape, from its configuration alone (no torch), for
the planner and the memory plan: the root's (embeddings, final norm, untied head) and one block's
(a transformer layer's). The models build exactly these (tests/unit/test_shapes.py checks every
architecture and option against a model built on the meta device).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["ParameterShapes", "gpt2_shapes", "gpt_neox_shapes", "llama_shapes"]

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
