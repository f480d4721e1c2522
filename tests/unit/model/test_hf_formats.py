"""Reading a checkpoint's config.json: no value is ever read as absent because it is 0, 0.0, false
or empty (an empty section is one whose entries each take their default, as transformers reads
it). Each key of each architecture's config.json (transformers 4 and 5 forms), and each key of
its RoPE section, is given each falsy value: the import either refuses it in one line naming that
key, or reads it as given (the config.json it exports says the same), or does not read it at all
(the model is the one without the change)."""

import pytest
import transformers

from tiny_llm.model.hf import model_config_from_hf, model_config_to_hf

SHAPE = {"vocab_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 16}


def _configs() -> dict[str, dict]:
    llama = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, **SHAPE).to_dict()
    neox = transformers.GPTNeoXConfig(hidden_size=16, intermediate_size=32, rotary_pct=0.5, **SHAPE).to_dict()
    gpt2 = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=2, n_positions=16).to_dict()
    old = {"rope_theta": 10000.0, "rope_scaling": None}  # transformers 4 kept RoPE at the top level
    return {
        "llama": llama,
        "llama-4": {k: v for k, v in llama.items() if k != "rope_parameters"} | old,
        "qwen2": transformers.Qwen2Config(
            hidden_size=16, intermediate_size=32, num_key_value_heads=2, **SHAPE
        ).to_dict(),
        "gpt2": gpt2,
        "gpt_neox": neox,
        "gpt_neox-4": {k: v for k, v in neox.items() if k != "rope_parameters"}
        | {"rotary_pct": 0.5, "rotary_emb_base": 10000, "rope_scaling": None},
    }


CONFIGS = _configs()
FALSY = (0, 0.0, False, "", {})


def _variants(data: dict):
    """(key as written, the config.json with it falsy), for every key and every RoPE sub-key."""
    for key, value in data.items():
        for falsy in FALSY:
            yield key, falsy, {**data, key: falsy}
        if isinstance(value, dict):
            for sub in value:
                for falsy in FALSY[:4]:
                    yield sub, falsy, {**data, key: {**value, sub: falsy}}


@pytest.mark.parametrize("name", CONFIGS)
def test_no_config_value_is_read_as_absent_for_being_falsy(name):
    data = CONFIGS[name]
    base = model_config_from_hf(data, "c/config.json")
    for key, falsy, changed in _variants(data):
        try:
            read = model_config_from_hf(changed, "c/config.json")
        except ValueError as error:
            message = str(error)
            assert "\n" not in message and message.startswith("c/config.json: "), message
            assert key in message, (key, falsy, message)
            continue
        if read == base:
            continue  # not read (or read as what it already was: 0/false where that is the meaning)
        if falsy == {} and isinstance(data[key], dict):  # an empty section: each entry its default, as
            absent = {k: v for k, v in data.items() if k != key}  # transformers reads it
            assert read == model_config_from_hf(absent, "c/config.json"), (name, key)
            continue
        exported = model_config_to_hf(read, __import__("torch").float64)
        where = exported if key in exported else exported.get("rope_parameters", {})
        assert key in where and where[key] == falsy, (name, key, falsy, read)


def test_a_rotary_fraction_of_zero_is_refused_not_taken_for_the_default():
    """transformers 4's GPT-NeoX with rotary_pct 0.0 (no rotary) is no model of ours: refused by
    name, never imported as the default fraction 0.25."""
    data = {**CONFIGS["gpt_neox-4"], "rotary_pct": 0.0}
    with pytest.raises(ValueError, match=r"^c/config.json: rotary_pct=0.0 cannot be represented here"):
        model_config_from_hf(data, "c/config.json")
    assert model_config_from_hf({**data, "rotary_pct": 0.5}, "c/config.json").rotary_pct == 0.5


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"model_type": None}, "model_type=None cannot be represented"),
        ({"model_type": {}}, "model_type={} cannot be represented"),
        (
            {"rope_scaling": {"rope_type": "linear", "factor": "8k"}},
            r"rope_scaling.factor: expected a number, got '8k'",
        ),
        ({"rope_scaling": "linear"}, "rope_scaling='linear' cannot be represented"),
        ({"num_attention_heads": 0}, "num_attention_heads=0 cannot be represented"),
        ({"rms_norm_eps": 0}, "rms_norm_eps: expected a positive number, got 0"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: expected true or false, got 'yes'"),
    ],
)
def test_malformed_values_are_refused_by_their_key(changes, named):
    data = {**CONFIGS["llama-4"], **changes}
    if changes.get("model_type", "x") is None:
        del data["model_type"]
    with pytest.raises(ValueError, match=r"^c/config.json: " + named):
        model_config_from_hf(data, "c/config.json")
