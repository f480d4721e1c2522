"""Configuration: strict keys and types, impossible values, YAML round trip, overrides."""

import pytest
import yaml

from tiny_llm.architectures import ARCHITECTURES, SHAPE
from tiny_llm.config import apply_overrides, config_from_dict, config_to_dict, dump_config, load_config


def test_defaults_round_trip(tmp_path):
    config = config_from_dict({"training": {"packed": {"workers": 2}, "tokens": 65536}})
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config
    assert config.training.packed.workers == 2 and config.model.tie_embeddings


@pytest.mark.parametrize(
    "model",
    [
        {"architecture": "llama", "n_kv_heads": 2, "rope_scaling": {"kind": "linear", "factor": 2.0}},
        {"architecture": "gpt2"},
        {"architecture": "gpt_neox", "rotary_pct": 0.5, "parallel_residual": False},
        {"architecture": "hf", "hf_config": "hf/config.json"},
    ],
)
def test_a_runs_resolved_yaml_holds_only_its_architectures_options_and_older_ones_load(tmp_path, model):
    config = config_from_dict({"model": model})
    written = yaml.safe_load(dump_config(config))
    assert list(written["model"]) == [
        k for k in config_to_dict(config)["model"] if k in SHAPE + ARCHITECTURES[model["architecture"]].options
    ]
    assert "parallel_residual" not in written["model"] or model["architecture"] == "gpt_neox"
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config
    path.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))  # an older one: every option
    assert load_config(path) == config


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"model": {"widht": 3}},
            "unknown key model.widht; allowed keys: model.architecture, model.hf_config, model.vocab_size",
        ),
        ({"optimiser": {}}, "unknown key optimiser; allowed keys: model, data, training"),
        (
            {"model": {"architecture": "gpt2", "rope_theta": 500000.0}},
            "model.rope_theta: expected its default unless model.architecture is llama or gpt_neox, got 500000.0",
        ),
        ({"model": {"architecture": "mamba"}}, "model.architecture: expected one of llama, gpt2, gpt_neox, hf"),
        ({"model": {"d_model": "32"}}, "model.d_model: expected an integer, got '32'"),
        ({"model": {"tie_embeddings": 1}}, "model.tie_embeddings: expected true or false"),
        (
            {"training": {"epochs": 2, "keep_states": [1, 3]}},
            "training.keep_states: expected virtual epochs up to training.epochs=2, got [3]",
        ),
        (
            {"model": {"d_model": 30, "n_heads": 4}},
            "model.n_heads: expected a divisor of model.d_model=30 ([1, 2, 3, 5, 6, 10, 15, 30])",
        ),
        ({"model": {"d_model": 12, "n_heads": 4}}, "even head_dim"),
        ({"model": {"n_kv_heads": 3}}, "model.n_kv_heads: expected null or a divisor of n_heads=4 ([1, 2, 4]), got 3"),
        (
            {"model": {"rotary_pct": 0.5}},
            "model.rotary_pct: expected its default unless model.architecture is gpt_neox",
        ),
        ({"model": {"architecture": "gpt2", "n_kv_heads": 2}}, "model.n_kv_heads: expected its default unless"),
        ({"model": {"architecture": "gpt2", "mlp_bias": False}}, "model.mlp_bias: expected null or true for gpt2"),
        ({"model": {"architecture": "gpt_neox", "attention_bias": "qkv"}}, "model.attention_bias: expected none, all"),
        ({"model": {"architecture": "gpt_neox", "rotary_pct": 0.1}}, "model.rotary_pct: expected a fraction giving"),
        (
            {"model": {"rope_scaling": {"kind": "llama3", "factor": 8.0}}},
            "model.rope_scaling.original_max_seq_len: expected a positive integer for kind llama3",
        ),
        ({"model": {"rope_scaling": {"kind": "yarn", "factor": 2.0}}}, "model.rope_scaling.kind: expected one of"),
        (
            {"training": {"batch_size": 4, "micro_batch_size": 8}},
            "training.micro_batch_size: expected at most training.batch_size=4, got 8",
        ),
        ({"training": {"optimizer": "adam"}}, "training.optimizer: expected one of 'adamw', 'sgd', got 'adam'"),
        ({"training": {"packed": {"workers": 1}}}, "training.packed.workers: expected an integer >= 2"),
        ({"training": {"tokens": 10}}, "training.tokens: expected at least epochs x batch_size x seq_len"),
        ({"training": {"tokens": 3 * 4 * 16 * 64, "epochs": 4, "packed": {"workers": 2}}}, "whole rounds of 2 workers"),
        ({"data": {"seq_len": 128}}, "data.seq_len: expected at most model.max_seq_len=64"),
        ({"training": {"lr": -1.0}}, "training.lr: expected a positive number"),
        ({"model": {"norm_eps": float("nan")}}, "model.norm_eps: expected a positive number, got nan"),
        ({"model": {"rope_theta": float("inf")}}, "model.rope_theta: expected a positive number, got inf"),
        (
            {"model": {"architecture": "gpt_neox", "rotary_pct": 1.5}},
            "model.rotary_pct: expected a number in (0, 1], got 1.5",
        ),
        (
            {"model": {"architecture": "gpt_neox", "rotary_pct": 0.0}},
            "model.rotary_pct: expected a number in (0, 1], got 0.0",
        ),
        (
            {"model": {"architecture": "gpt_neox", "rotary_pct": float("nan")}},
            "model.rotary_pct: expected a number in (0, 1], got nan",
        ),
        (
            {"model": {"rope_scaling": {"kind": "linear", "factor": float("nan")}}},
            "model.rope_scaling.factor: expected a positive number, got nan",
        ),
        (
            {"model": {"rope_scaling": {"kind": "linear", "factor": 2.0, "original_max_seq_len": 64}}},
            "model.rope_scaling.original_max_seq_len: expected no value under kind linear",
        ),
    ],
)
def test_bad_values_name_the_key(data, message):
    with pytest.raises(ValueError) as error:
        config_from_dict(data)
    assert message in str(error.value)


def test_load_config_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("training: {colour: blue}\n")
    with pytest.raises(ValueError, match=r"bad.yaml: unknown key training.colour"):
        load_config(path)


def test_overrides_parse_yaml_values():
    data = apply_overrides(
        {"training": {"lr": 0.1}}, ["training.lr=1e-3", "training.packed.workers=4", "model.tie_embeddings=false"]
    )
    assert data == {"training": {"lr": 1e-3, "packed": {"workers": 4}}, "model": {"tie_embeddings": False}}
    with pytest.raises(ValueError, match="expected section.key=value"):
        apply_overrides({}, ["training.lr"])


def test_derived_sizes():
    config = config_from_dict(
        {
            "data": {"seq_len": 8},
            "model": {"max_seq_len": 8},
            "training": {"batch_size": 4, "micro_batch_size": 4, "tokens": 1000, "epochs": 3},
        }
    )
    assert config.steps_per_epoch == 1000 // (3 * 32) == 10
    assert config.total_batches == 30


def test_every_value_an_architecture_cannot_build_is_refused_by_its_declaration():
    """The registry's ``allowed`` values, for every architecture that declares them: each other value
    of the option is refused naming the option, the architecture and why; rotary architectures
    refuse an odd rotated share."""
    from tiny_llm.config import ModelConfig

    field_types = {"attention_bias": ("none", "qkv", "all", None), "mlp_bias": (True, False, None)}
    shape = dict(d_model=8, n_heads=2, d_ff=16)
    for spec in ARCHITECTURES.values():
        for option, values, why in spec.allowed:
            for value in field_types[option]:
                given = {"architecture": spec.name, option: value, **shape}
                if value in values:
                    ModelConfig(**given)
                    continue
                with pytest.raises(ValueError, match=rf"model\.{option}: expected .* for {spec.name} \({why}\)"):
                    ModelConfig(**given)
        if spec.rotary:
            with pytest.raises(ValueError, match="even"):
                ModelConfig(architecture=spec.name, d_model=6, n_heads=2, d_ff=16)
