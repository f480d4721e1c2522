"""Reading a config.json's values: 0 and false are values, bad ones are refused naming the file's key,
RoPE read wherever transformers 4 or 5 keeps it."""

import pytest

from tiny_llm.model.hf_values import flag, given, mapping, model, number, positive, refusal, rope

REFUSE = refusal("config.json")


def test_zero_false_and_empty_are_given_values_and_only_absent_or_null_is_not():
    data = {"a": 0, "b": False, "c": "", "d": None}
    assert given(data, "a") == ("a", 0) and given(data, "b") == ("b", False) and given(data, "c") == ("c", "")
    assert given(data, "d", "a") == ("a", 0)  # null: the next key
    assert given(data, "x", "y", default=7) == ("x", 7)


def test_sizes_and_switches_are_refused_by_the_key_the_file_spells():
    assert positive({"hidden_size": 64}, "hidden_size", REFUSE) == 64
    for bad in (0, -1, 2.5, True, "64"):
        with pytest.raises(
            ValueError, match=r"config.json: hidden_size=.* cannot be represented here \(need a positive"
        ):
            positive({"hidden_size": bad}, "hidden_size", REFUSE)
    assert flag({"tie_word_embeddings": 0}, "tie_word_embeddings", True) is False  # 0 is given: not the default
    assert flag({}, "tie_word_embeddings", True) is True
    with pytest.raises(ValueError, match="use_bias: expected true or false, got 'yes'"):
        flag({"use_bias": "yes"}, "use_bias", False)
    assert mapping({"s": None}, "s", REFUSE) == {}
    with pytest.raises(ValueError, match=r"s=\[1\] cannot be represented here \(need a mapping or null\)"):
        mapping({"s": [1]}, "s", REFUSE)
    with pytest.raises(ValueError, match=r"rope.factor: expected a number, got True"):
        number({"factor": True}, "factor", "rope")
    with pytest.raises(ValueError, match="an integer"):
        number({"n": 2.5}, "n", "rope", int)


def test_rope_is_read_from_transformers_4_and_5_alike():
    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    four = rope({"rope_theta": 500000.0, "rope_scaling": llama3}, REFUSE)
    five = rope({"rope_parameters": {"rope_theta": 500000.0, **llama3}}, REFUSE)
    assert four == five and four[0] == 500000.0 and four[1].kind == "llama3" and four[1].original_max_seq_len == 8192
    assert rope({}, REFUSE) == (10000.0, None)
    assert rope({"rotary_emb_base": 0.5e4, "rope_scaling": {"type": "linear", "factor": 2}}, REFUSE)[1].factor == 2.0
    with pytest.raises(ValueError, match=r"rope_scaling=.* \(RoPE scaling of kind default, linear or llama3 only\)"):
        rope({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, REFUSE)
    with pytest.raises(ValueError, match=r"rope_theta=0.0 cannot be represented here \(need a positive RoPE base\)"):
        rope({"rope_theta": 0.0}, REFUSE)


def test_a_model_value_refused_is_named_by_the_config_json_key():
    assert model("c.json", {}, d_model=8, n_heads=2, d_ff=16).d_model == 8
    with pytest.raises(ValueError, match=r"^c.json: num_attention_heads"):
        model("c.json", {"n_heads": "num_attention_heads"}, d_model=8, n_heads=3, d_ff=16)
