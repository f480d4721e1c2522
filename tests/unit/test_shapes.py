"""The parameters each architecture declares without torch are those its model builds: names,
shapes, the count, what a sharded pass gathers; for every architecture and option that changes
a parameter, and the adapter's models read from a meta-device build."""

import json
import math

import pytest
import torch

from tiny_llm.architectures import ARCHITECTURES, build_model, parameter_shapes
from tiny_llm.config import ModelConfig
from tiny_llm.shapes import Rows, shard_chunk, shard_span

SHAPE = dict(vocab_size=13, d_model=12, n_layers=2, n_heads=3, d_ff=20, max_seq_len=7)
VARIANTS = [
    dict(architecture="llama"),
    dict(architecture="llama", n_kv_heads=1, attention_bias="qkv", mlp_bias=True, tie_embeddings=False),
    dict(architecture="llama", attention_bias="all", n_layers=1),
    dict(architecture="gpt2"),
    dict(architecture="gpt2", tie_embeddings=False),
    dict(architecture="gpt_neox"),
    dict(architecture="gpt_neox", attention_bias="none", mlp_bias=False, tie_embeddings=False),
]


def _built(config: ModelConfig) -> torch.nn.Module:
    with torch.device("meta"):
        return build_model(config)


def test_every_architecture_with_rules_declares_its_parameters():
    assert all(spec.parameters is not None for spec in ARCHITECTURES.values() if spec.jets)
    assert {v["architecture"] for v in VARIANTS} == {name for name, spec in ARCHITECTURES.items() if spec.jets}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
def test_declared_parameters_are_the_built_ones(variant):
    config = ModelConfig(**{**SHAPE, **variant})
    declared, model = parameter_shapes(config), _built(config)
    built = {name: tuple(p.shape) for name, p in model.named_parameters()}
    layers = {f"layers.{i}.{name}": shape for i in range(config.n_layers) for name, shape in declared.block.items()}
    assert {**declared.root, **layers} == built
    assert declared.count == sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for p in layer.parameters()) for layer in model.layers]
    assert declared.block_count == max(blocks, default=0)
    by_rows = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} | {id(model.head_weight)}
    gathered = [p.numel() for p in model.parameters() if id(p) not in by_rows]
    assert declared.largest_gathered == max(gathered)


def test_an_adapter_model_is_read_from_a_meta_build(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPTNeoXConfig(
        vocab_size=11, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    (tmp_path / "config.json").write_text(json.dumps(hf.to_dict()))
    config = ModelConfig(
        architecture="hf", hf_config=str(tmp_path / "config.json"), vocab_size=11, d_model=8, n_heads=2, d_ff=16
    )
    declared = parameter_shapes(config)
    model = _built(config)
    assert declared.count == sum(p.numel() for p in model.parameters())
    assert declared.blocks == 0 and declared.root_count == declared.count
    assert declared.largest_gathered == max(math.prod(s) for k, s in declared.root.items() if k not in declared.by_rows)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
def test_the_layout_from_declared_shapes_is_the_built_models(variant):
    """A rank's rows counted from the declared shapes (the memory plan's) are those of the layout of
    the meta-built model's parameters (the placement's), for 1, 2 and 3 ranks; every entry is held
    by exactly one rank."""
    config = ModelConfig(**{**SHAPE, **variant})
    built = tuple(tuple(p.shape) for p in _built(config).parameters())
    D = sum(math.prod(s) for s in built)
    for ranks in (1, 2, 3):
        declared = [parameter_shapes(config).rows(rank, ranks, ranks > 1) for rank in range(ranks)]
        layouts = [Rows(built, rank, ranks, ranks > 1) for rank in range(ranks)]
        assert [r.held for r in declared] == [r.held for r in layouts] and declared[0].D == layouts[0].D == D
        held = torch.cat([r.indices() for r in layouts])
        assert torch.equal(held.sort().values, torch.arange(D))  # a partition of the D entries


@pytest.mark.parametrize(("rows", "shards"), [(4, 3), (7, 3), (5, 2), (1, 2), (6, 6), (13, 4)])
def test_a_shard_span_is_fsdp2s_row_chunk(rows, shards):
    """Every rank's span is torch.chunk's piece (FSDP2's Shard(0)): ⌈rows / shards⌉ rows, the last
    ranks' shorter or empty, the spans tiling the rows in rank order."""
    pieces = list(torch.arange(rows).chunk(shards)) + [torch.arange(0)] * shards
    for rank in range(shards):
        first, stop = shard_span(rows, rank, shards)
        assert torch.equal(torch.arange(rows)[first:stop], pieces[rank])
    assert shard_span(rows, shards - 1, shards)[1] == rows and shard_chunk(rows, shards) == len(pieces[0])


@pytest.mark.parametrize("name", [a.name for a in ARCHITECTURES.values() if a.parameters is not None])
def test_a_parameter_is_in_the_same_block_under_our_name_and_its_checkpoints(name):
    """The per-block statistics file each parameter where its table declares, and the same
    parameter of the Hugging Face checkpoint (the adapter's name for it) lands in the same block."""
    from tiny_llm.curvature.blocks import block_of
    from tiny_llm.model.hf_formats import export_format

    table = ARCHITECTURES[name].parameters
    theirs = export_format(ModelConfig(**SHAPE, architecture=name))
    for p in table.root:
        assert block_of(p.name) == p.block == block_of(p.theirs), p.name
    for p in table.block:
        ours, hf = block_of(f"layers.3.{p.name}"), block_of(f"{theirs.layer_prefix}.3.{p.theirs}")
        assert ours == hf == (p.block if p.block == "norms" else f"layer 3 {p.block}"), p.name
