"""Tiny training suites saved by transformers' own ``Trainer`` (no download): one
``checkpoint-<step>`` directory per save with config.json, model.safetensors, the byte-level BPE
tokenizer it was trained with (tokenizer.json and tokenizer_config.json), trainer_state.json
(global_step, train_batch_size and, when asked, num_input_tokens_seen) and the Trainer's pickled
optimizer, scheduler and arguments (which an import never reads)."""

from __future__ import annotations

from pathlib import Path

import torch

from tiny_llm.data.corpus import demo_corpus

STEPS = (2, 4, 6)
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
    tokenizer.train_from_iterator(
        [text],
        trainer=trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=["<|endoftext|>"],
        ),
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(path)
    return fast


def make_suite(
    root: Path,
    architecture: str = "gpt_neox",
    steps=STEPS,
    tokens_seen: bool = True,
    text: str | None = None,
    seed: int = 0,
    **arguments,
) -> list[Path]:
    """Train a tiny model of ``architecture`` (gpt_neox or llama) from initialisation ``seed`` on
    ``text`` with transformers' own ``Trainer`` (CPU, a few seconds), saving at each of ``steps``
    (evenly spaced) under ``root``/out, with ``num_input_tokens_seen`` counted or not; returns the
    checkpoint directories, oldest first; ``arguments``: more TrainingArguments."""
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    text = text or corpus_text()
    tokenizer = train_tokenizer(root / "tokenizer", text)
    tokenizer.pad_token = tokenizer.eos_token
    ids = tokenizer(text).input_ids
    blocks = [ids[i : i + SEQ] for i in range(0, len(ids) - SEQ, SEQ)]

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return len(blocks)

        def __getitem__(self, i):
            return {"input_ids": torch.tensor(blocks[i]), "labels": torch.tensor(blocks[i])}

    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if architecture == "gpt_neox":
        model = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**shape, rotary_pct=0.5))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, num_key_value_heads=2))
    every = steps[0]
    assert list(steps) == [every * (i + 1) for i in range(len(steps))], "evenly spaced saves"
    args = transformers.TrainingArguments(
        output_dir=str(root / "out"),
        per_device_train_batch_size=BATCH,
        max_steps=steps[-1],
        save_steps=every,
        logging_steps=every,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        include_num_input_tokens_seen=tokens_seen,
        dataloader_num_workers=0,
        **arguments,
    )
    transformers.Trainer(model=model, args=args, train_dataset=Blocks(), processing_class=tokenizer).train()
    return [root / "out" / f"checkpoint-{step}" for step in steps]


def run_config_text(cache: str = "cache/corpus") -> str:
    """A run configuration for the suite's analyses: data and the offset epoch's training keys."""
    return (
        f"data: {{cache: {cache}, seq_len: {SEQ}, shuffle_group_blocks: 4}}\n"
        f"training: {{batch_size: {BATCH}, micro_batch_size: 3, tokens: {BATCH * SEQ * 3}, epochs: 1}}\n"
    )
