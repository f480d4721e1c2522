"""What the sharded operator (:mod:`tiny_llm.curvature.sharded`) holds on each rank beyond its
shards, from a model's configuration alone (no torch), so that the memory plan asks it rather than
restating it: the root's and one block's parameters, gathered for a pass; the gather buffers of a
jet engine's directions; the 1/N vocabulary whose activations a sharded jet pass holds.
"""

from __future__ import annotations

import dataclasses

from tiny_llm.architectures import jet_rules
from tiny_llm.config import ModelConfig
from tiny_llm.curvature.engines import GRADIENT
from tiny_llm.curvature.engines import engine as engine_named
from tiny_llm.shapes import shard_chunk

__all__ = ["SHARDED_GRADIENT_HEAD_CHUNKS", "forms_shape", "gathered_parameters", "head_chunked", "held_unsharded"]


SHARDED_GRADIENT_HEAD_CHUNKS = False
"""Whether a gradient on a sharded model takes the head and loss in token chunks: not yet. Chunking
runs the head on ``model.hidden``, which bypasses the FSDP root's hooks (the gather of the root's
parameters, the reduce-scatter of their gradients), so a sharded gradient takes the head whole."""


def head_chunked(config: ModelConfig, engine: str, shards: int) -> bool:
    """Whether a pass of ``engine`` (or GRADIENT) may take the head and loss in token chunks, on a
    model sharded over ``shards`` ranks (1: whole): our architectures' gradients and the engines that
    declare it (``Engine.head_chunks``); sharded, the jets only (their loss runs on each rank's rows
    of the vocabulary) unless SHARDED_GRADIENT_HEAD_CHUNKS."""
    if not jet_rules(config):
        return False
    if engine == GRADIENT:
        return shards <= 1 or SHARDED_GRADIENT_HEAD_CHUNKS
    spec = engine_named(engine)
    return spec.head_chunks and (shards <= 1 or spec.jets or SHARDED_GRADIENT_HEAD_CHUNKS)


def gathered_parameters(config: ModelConfig) -> tuple[int, int, int]:
    """(the root's own parameters, the largest block's, the largest parameter gathered whole) of a
    model sharded block by block: what a rank holds unsharded while a sharded pass runs (the root:
    embedding, final norm, untied head; a block: one transformer layer), and the parameter whose K
    gathered directions need the largest gather buffers. The embeddings' and the head's directions
    are never gathered whole (their rows are looked up, the loss runs on each rank's rows)."""
    from tiny_llm.architectures import parameter_shapes

    shapes = parameter_shapes(config)
    return shapes.root_count, shapes.block_count, shapes.largest_gathered


def held_unsharded(config: ModelConfig, engine: str, K: int, shards: int, itemsize: int) -> dict[str, int]:
    """Bytes a rank holds unsharded, beyond its shards, while a pass of this operator runs over
    ``shards`` ranks (none on one process): by key, ``gradient`` (the root's and one block's
    parameters and gradients) and ``engine``'s forms. The memory plan prices these; this module
    is the one that knows them."""
    if shards <= 1:
        return {GRADIENT: 0, engine: 0}
    root, block, largest = gathered_parameters(config)
    gradient = 2 * (root + block) * itemsize
    # jets: the root's and one block's parameters, the K directions of one block (or of a small root
    # parameter, the final norm's, gathered only while its rule runs), and the gather's buffers: one
    # padded chunk and one parameter-sized scratch; finite differences run gradient passes and gather
    # no directions
    jets = (root + block + K * max(block, largest) + largest + shard_chunk(largest, shards)) * itemsize
    return {GRADIENT: gradient, engine: jets if engine_named(engine).jets else gradient}


def forms_shape(config: ModelConfig, engine: str, shards: int) -> ModelConfig:
    """The shape whose activations a rank's forms pass holds: sharded jets run the loss on each
    rank's rows of the vocabulary, so theirs are those of a 1/shards vocabulary."""
    if shards > 1 and engine_named(engine).jets:
        return dataclasses.replace(config, vocab_size=shard_chunk(config.vocab_size, shards))
    return config
