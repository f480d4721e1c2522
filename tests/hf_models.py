"""Tiny random Hugging Face models of the families read natively (GPT-NeoX, the Llama family with
grouped-query heads, biases and RoPE scaling, Mistral, Qwen2), made by transformers itself in
float64, shared by the tests that read them natively and through the adapter."""

import torch
import transformers

from tiny_llm.config import RopeScaling

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


def hf_model(path, config):
    """A random float64 model of ``config`` with every parameter away from its initial value (biases
    nonzero, norms away from 1, so that a swapped or dropped tensor shows), saved to ``path``."""
    torch.manual_seed(3)
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    return model


def hf_tokens():
    return torch.randint(0, SHAPE["vocab_size"], (3, 12), generator=torch.Generator().manual_seed(5))


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
