"""Parameter blocks: every architecture's names (and Hugging Face's) land in the same blocks."""

import pytest

from tiny_llm.architectures import build_model
from tiny_llm.config import ModelConfig
from tiny_llm.curvature.blocks import block_count, block_of, check_block_layout, model_blocks, parameter_blocks


@pytest.mark.parametrize("architecture, tied", [("llama", True), ("llama", False), ("gpt2", True), ("gpt_neox", False)])
def test_native_models_have_the_blocks_the_plan_counts(architecture, tied):
    config = ModelConfig(
        architecture=architecture, vocab_size=16, d_model=8, n_heads=2, d_ff=16, n_layers=3, tie_embeddings=tied
    )
    names = [n for n, _ in build_model(config).named_parameters()]
    blocks = parameter_blocks(names)
    expected = ["embedding", *(f"layer {i} {p}" for i in range(3) for p in ("attention", "mlp")), "norms"]
    assert [b for b, _ in blocks] == expected + ([] if tied else ["head"])
    assert len(blocks) == block_count(3, tied)
    assert sorted(i for _, indices in blocks for i in indices) == list(range(len(names)))  # a partition


@pytest.mark.parametrize(
    "name, block",
    [
        ("model.embed_tokens.weight", "embedding"),
        ("model.layers.0.self_attn.q_proj.bias", "layer 0 attention"),
        ("model.layers.0.mlp.gate_proj.weight", "layer 0 mlp"),
        ("model.layers.0.post_attention_layernorm.weight", "norms"),
        ("lm_head.weight", "head"),
        ("gpt_neox.embed_in.weight", "embedding"),
        ("gpt_neox.layers.3.attention.query_key_value.weight", "layer 3 attention"),
        ("gpt_neox.final_layer_norm.bias", "norms"),
        ("embed_out.weight", "head"),
        ("transformer.wpe.weight", "embedding"),
        ("transformer.h.2.ln_1.weight", "norms"),
        ("transformer.h.2.attn.c_attn.weight", "layer 2 attention"),
        ("transformer.h.2.mlp.c_fc.weight", "layer 2 mlp"),
        ("transformer.ln_f.bias", "norms"),
        ("something.else", None),
    ],
)
def test_hugging_face_names_are_classified_alike(name, block):
    assert block_of(name) == block


def test_blocks_are_in_reading_order():
    names = ["lm_head.weight", "model.norm.weight", "model.layers.10.mlp.w", "model.layers.2.self_attn.w", "wte.w"]
    assert [b for b, _ in parameter_blocks(names)] == [
        "embedding",
        "layer 2 attention",
        "layer 10 mlp",
        "norms",
        "head",
    ]


def test_no_parameter_is_filed_under_a_made_up_block():
    """A layout with an unknown parameter is refused by name; a measurement without per-block
    curvature leaves its blocks out and says so."""
    names = ["lm_head.weight", "x", "model.norm.weight"]
    with pytest.raises(ValueError, match=r"1 parameters of this model are of no block this project knows .*: x;"):
        parameter_blocks(names)
    said = []
    assert model_blocks(names, block_curvature=False, say=said.append) == []
    assert said == ["per-block statistics left out: this model has parameters of no block this project knows"]
    with pytest.raises(ValueError, match="block_curvature"):
        model_blocks(names, block_curvature=True, say=said.append)
    assert model_blocks(names[:1], block_curvature=False, say=said.append) == [("head", [0])]


def test_a_layout_of_unknown_parameters_is_refused_for_per_block_statistics():
    model = build_model(ModelConfig(architecture="gpt_neox", d_model=8, n_heads=2, d_ff=16, n_layers=1))
    check_block_layout([name for name, _ in model.named_parameters()])  # every native one is known
    names = ["model.embed_tokens.weight", "model.mixer.0.kernel", "model.mixer.1.kernel", "lm_head.weight"]
    with pytest.raises(
        ValueError,
        match=r"block_curvature: 2 parameters of this model are of no block this project knows .*: "
        r"model.mixer.0.kernel, model.mixer.1.kernel; analyse it without block_curvature",
    ):
        check_block_layout(names)
