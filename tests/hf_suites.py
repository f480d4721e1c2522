"""Tiny training suites laid out as transformers' ``Trainer`` saves them (no download): one
``checkpoint-<step>`` directory per save with config.json, model.safetensors, a byte-level BPE
tokenizer (tokenizer.json and tokenizer_config.json, saved by ``PreTrainedTokenizerFast``) and
trainer_state.json (global_step, train_batch_size and, when asked, num_input_tokens_seen)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tiny_llm.data.corpus import demo_corpus

STEPS = (50, 100, 150)
BATCH, SEQ = 4, 12
"""The suite's per-device batch and sequence length: tokens per step = 48."""


def corpus_text(n: int = 40_000, seed: int = 4) -> str:
    return bytes(demo_corpus(n, seed=seed)).decode()


def train_tokenizer(path: Path, text: str, vocab_size: int = 300):
    """A byte-level BPE trained on ``text``, saved as a transformers fast tokenizer in ``path``."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([text], trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(path)
    return fast


def make_suite(root: Path, architecture: str = "gpt_neox", steps=STEPS, tokens_seen: bool = True,
               text: str | None = None) -> list[Path]:
    """Save a tiny model of ``architecture`` (gpt_neox or llama) at each step, Trainer-style, under
    ``root``; returns the checkpoint directories, oldest first."""
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(root / "tokenizer", text or corpus_text())
    vocab = len(tokenizer)
    if architecture == "gpt_neox":
        config = transformers.GPTNeoXConfig(vocab_size=vocab, hidden_size=8, num_hidden_layers=1,
                                            num_attention_heads=2, intermediate_size=16, max_position_embeddings=16,
                                            rotary_pct=0.5, tie_word_embeddings=False)
        model = transformers.GPTNeoXForCausalLM(config)
    else:
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=2, intermediate_size=16, max_position_embeddings=16,
                                          tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    torch.manual_seed(0)
    paths = []
    for step in steps:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
        path = root / f"checkpoint-{step}"
        model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)
        state = {"global_step": step, "epoch": step / 100, "train_batch_size": BATCH, "max_steps": steps[-1],
                 "log_history": [{"step": step, "loss": 5.0 - step / 100}]}
        if tokens_seen:
            state["num_input_tokens_seen"] = step * BATCH * SEQ
        (path / "trainer_state.json").write_text(json.dumps(state, indent=2))
        paths.append(path)
    return paths


def run_config_text(cache: str = "cache/corpus") -> str:
    """A run configuration for the suite's analyses: data and the offset epoch's training keys."""
    return (f"data: {{cache: {cache}, seq_len: {SEQ}, shuffle_group_blocks: 4}}\n"
            f"training: {{batch_size: {BATCH}, micro_batch_size: 3, tokens: {BATCH * SEQ * 3}, epochs: 1}}\n")
