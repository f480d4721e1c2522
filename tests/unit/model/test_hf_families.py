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
from hf_models import CASES, hf_model, hf_tokens

from tiny_llm.architectures import build_model
from tiny_llm.config import ModelConfig
from tiny_llm.model.hf import read_hf, write_hf


@pytest.fixture
def float64(monkeypatch):
    float64_transformers(monkeypatch)


def _relative_error(ours, theirs) -> float:
    """Largest difference relative to the logits' scale (their largest magnitude)."""
    return float((ours - theirs).abs().max() / theirs.abs().max())


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
    hf = hf_model(tmp_path / "theirs", hf_config)
    config, state = read_hf(tmp_path / "theirs")
    assert config == _expected(case, hf_config)
    model = build_model(config).double()
    model.load_state_dict(state, strict=True)
    x = hf_tokens()
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
    hf = hf_model(tmp_path / "theirs", CASES[case][0])
    config, state = read_hf(tmp_path / "theirs")
    model = build_model(config).double()
    model.load_state_dict(state, strict=True)
    x = hf_tokens()
    with torch.no_grad():
        assert _relative_error(model(x), hf(x).logits) < 1e-6


def _saved_config(tmp_path, config, **changes):
    path = tmp_path / "theirs"
    hf_model(path, config)
    data = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**data, **changes}))
    return path


@pytest.mark.parametrize(
    ("case", "changes", "message"),
    [
        ("mistral", {"sliding_window": 8}, "sliding_window=8"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "layer_types": None}, "sliding_window=4"),
        (
            "llama-linear",
            {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1.0}},
            "rope_parameters",
        ),
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
