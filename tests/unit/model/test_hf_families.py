"""The checkpoints researchers study, read natively: GPT-NeoX (Pythia: partial rotary, parallel or
sequential residual, exact GELU, untied head) and the Llama family with grouped-query attention,
biases and RoPE scaling (Llama 3.x, Mistral and Qwen2 layouts). Tiny random models made by
transformers itself and saved locally: logits equal to transformers' in float64 both ways, round
trips bit-identical, what cannot be represented refused by name."""

import json

import pytest
import torch
import transformers  # installed by make test (envs/requirements.txt): these tests never skip
from hf_float64 import float64_transformers

from tiny_llm.config import ModelConfig, RopeScaling
from tiny_llm.model.architectures import build_model
from tiny_llm.model.hf import read_hf, write_hf

SHAPE = dict(
    vocab_size=40,
    hidden_size=32,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=12,
)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 8.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 50.0,
}
"""Llama 3.x's scaling, at a context and base where the four rotary frequencies of an 8-wide head
fall into all three bands: wavelengths 6.3 (< 64/8: kept), 16.7 and 44.4 (blended), 118 (> 64/1:
divided by the factor)."""


@pytest.fixture
def float64(monkeypatch):
    float64_transformers(monkeypatch)


def _hf_model(path, config):
    """A random float64 model of ``config`` with every parameter away from its initial value (biases
    nonzero, norms away from 1, so that a swapped or dropped tensor shows), saved to ``path``."""
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    return model


def _tokens():
    return torch.randint(0, SHAPE["vocab_size"], (3, 12), generator=torch.Generator().manual_seed(5))


def _relative_error(ours, theirs) -> float:
    """Largest difference relative to the logits' scale (their largest magnitude)."""
    return float((ours - theirs).abs().max() / theirs.abs().max())


CASES = {
    "pythia": (
        transformers.GPTNeoXConfig(**SHAPE, rotary_pct=0.25, tie_word_embeddings=False),
        dict(architecture="gpt_neox", rotary_pct=0.25, tie_embeddings=False),
    ),
    "neox-sequential-tied": (
        transformers.GPTNeoXConfig(
            **SHAPE, rotary_pct=1.0, use_parallel_residual=False, attention_bias=False, tie_word_embeddings=True
        ),
        dict(architecture="gpt_neox", parallel_residual=False, attention_bias="none", tie_embeddings=True),
    ),
    "llama3-gqa-biases": (
        transformers.LlamaConfig(
            **SHAPE,
            num_key_value_heads=2,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters=LLAMA3,
            tie_word_embeddings=False,
        ),
        dict(
            n_kv_heads=2,
            attention_bias="all",
            mlp_bias=True,
            rope_theta=50.0,
            rope_scaling=RopeScaling(kind="llama3", factor=8.0, high_freq_factor=8.0, original_max_seq_len=64),
            tie_embeddings=False,
        ),
    ),
    "llama-linear": (
        transformers.LlamaConfig(
            **SHAPE,
            rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 100.0},
            tie_word_embeddings=True,
        ),
        dict(rope_theta=100.0, rope_scaling=RopeScaling(kind="linear", factor=4.0)),
    ),
    "mistral": (
        transformers.MistralConfig(**SHAPE, num_key_value_heads=1, sliding_window=None, tie_word_embeddings=False),
        dict(n_kv_heads=1, tie_embeddings=False),
    ),
    "qwen2": (
        transformers.Qwen2Config(**SHAPE, num_key_value_heads=2, tie_word_embeddings=True),
        dict(n_kv_heads=2, attention_bias="qkv"),
    ),
}
"""transformers' configuration -> the ModelConfig it must import as (besides the shape)."""

EXPORTED_AS = {
    "pythia": "GPTNeoXForCausalLM",
    "neox-sequential-tied": "GPTNeoXForCausalLM",
    "llama3-gqa-biases": "LlamaForCausalLM",
    "llama-linear": "LlamaForCausalLM",
    "mistral": "LlamaForCausalLM",  # a Mistral without a window computes a Llama
    "qwen2": "Qwen2ForCausalLM",
}


def _expected(case: str, hf_config) -> ModelConfig:
    eps = getattr(hf_config, "rms_norm_eps", None) or hf_config.layer_norm_eps
    shape = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=24, max_seq_len=12, norm_eps=eps)
    return ModelConfig(**{**shape, **CASES[case][1]})


@pytest.mark.parametrize("case", list(CASES))
def test_imported_models_give_transformers_logits_and_export_round_trips(tmp_path, float64, case):
    hf_config, _ = CASES[case]
    hf = _hf_model(tmp_path / "theirs", hf_config)
    config, state = read_hf(tmp_path / "theirs")
    assert config == _expected(case, hf_config)
    model = build_model(config).double()
    model.load_state_dict(state, strict=True)
    x = _tokens()
    with torch.no_grad():
        assert _relative_error(model(x), hf(x).logits) < 1e-12

    write_hf(tmp_path / "ours", config, model.state_dict())
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float64).eval()
    assert type(again).__name__ == EXPORTED_AS[case]
    with torch.no_grad():
        assert _relative_error(again(x).logits, model(x)) < 1e-12
    config_again, state_again = read_hf(tmp_path / "ours")
    assert config_again == config and state_again.keys() == state.keys()
    assert all(torch.equal(state_again[k], v) and state_again[k].dtype == v.dtype for k, v in state.items())


@pytest.mark.parametrize("case", ["pythia", "llama3-gqa-biases", "qwen2"])
def test_stock_transformers_agrees_to_its_float32_rotary_and_norms(tmp_path, case):
    """Without the float64 swap (hf_float64) transformers' float32 RoPE frequencies and RMSNorm
    differ from a float64 computation by about 1e-7 of the logits' scale (measured 2e-8 to 3e-7)."""
    hf = _hf_model(tmp_path / "theirs", CASES[case][0])
    config, state = read_hf(tmp_path / "theirs")
    model = build_model(config).double()
    model.load_state_dict(state, strict=True)
    x = _tokens()
    with torch.no_grad():
        assert _relative_error(model(x), hf(x).logits) < 1e-6


def _saved_config(tmp_path, config, **changes):
    path = tmp_path / "theirs"
    _hf_model(path, config)
    data = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**data, **changes}))
    return path


@pytest.mark.parametrize(
    ("case", "changes", "message"),
    [
        ("mistral", {"sliding_window": 8}, "sliding_window=8"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "layer_types": None}, "sliding_window=4"),
        ("llama-linear", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1.0}}, "rope_scaling"),
        ("llama-linear", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ("pythia", {"hidden_act": "gelu_new"}, "hidden_act='gelu_new'"),
    ],
)
def test_what_cannot_be_represented_is_refused_by_name(tmp_path, case, changes, message):
    path = _saved_config(tmp_path, CASES[case][0], **changes)
    with pytest.raises(ValueError, match="cannot be represented") as error:
        read_hf(path)
    assert message in str(error.value) and str(path / "config.json") in str(error.value)


def test_a_qwen2_window_that_covers_the_context_imports(tmp_path):
    path = _saved_config(tmp_path, CASES["qwen2"][0], use_sliding_window=True, sliding_window=12, layer_types=None)
    assert read_hf(path)[0].n_kv_heads == 2
