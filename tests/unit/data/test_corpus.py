"""Token sources: demo corpus determinism, text and token-array readers, source dispatch."""

import numpy as np
import pytest

from tiny_llm.config import DataConfig
from tiny_llm.data.corpus import Source, demo_corpus, prepare_source_cache, read_text_files, read_token_files
from tiny_llm.data.tokens import TokenCache


def test_demo_corpus_is_deterministic_and_structured():
    a, b = demo_corpus(5000, seed=1), demo_corpus(5000, seed=1)
    assert np.array_equal(a, b) and len(a) == 5000
    assert not np.array_equal(a, demo_corpus(5000, seed=2))
    text = bytes(a).decode("ascii")
    assert " + " in text and " the " in text and text.count("\n") > 100
    # Learnable statistics: far fewer distinct bytes than the vocabulary, skewed frequencies.
    counts = np.bincount(a, minlength=256)
    assert (counts > 0).sum() < 60 and counts.max() > 10 * np.median(counts[counts > 0])


def test_text_reader_refuses_invalid_utf8(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe")
    with pytest.raises(ValueError, match="is not valid UTF-8"):
        read_text_files([tmp_path / "bad.txt"])
    with pytest.raises(ValueError, match="does not exist"):
        read_text_files([tmp_path / "missing.txt"])


def test_token_reader_checks_size_and_range(tmp_path):
    np.arange(10, dtype="<u2").tofile(tmp_path / "ids.bin")
    segments, records = read_token_files([tmp_path / "ids.bin"], "uint16", 16)
    assert segments[0].tolist() == list(range(10)) and records[0]["tokens"] == 10
    (tmp_path / "odd.bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="not a multiple of 2"):
        read_token_files([tmp_path / "odd.bin"], "uint16", 16)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 5\)"):
        read_token_files([tmp_path / "ids.bin"], "uint16", 5)


def test_large_vocabulary_uses_uint32_shards(tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(0, 70000 * 3, 7) % 70000)
    data = DataConfig(cache=str(tmp_path / "cache"), seq_len=8, shuffle_group_blocks=2)
    cache = TokenCache(prepare_source_cache(data, Source("tokens", (tmp_path / "ids.npy",), vocab_size=70000)))
    source, offset = cache.block_sources()[0][0]
    assert cache.meta["dtype"] == "uint32" and cache.tokens([0])[0, 1].item() == (offset + 1) * 7 % 70000


def test_source_dispatch_errors(tmp_path):
    data = DataConfig(cache=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="expected one of 'demo', 'text', 'tokens', got 'web'"):
        prepare_source_cache(data, Source("web"))
    with pytest.raises(ValueError, match="source text needs input files"):
        prepare_source_cache(data, Source("text"))
    with pytest.raises(ValueError, match="source demo needs a capacity"):
        prepare_source_cache(data, Source("demo"))


def _bpe_tokenizer(path, corpus):
    """A byte-level BPE tokenizer trained by the test on ``corpus`` (no download), saved as a
    Hugging Face tokenizer directory (tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    tokenizer.train_from_iterator([corpus], trainer=trainer)
    path.mkdir()
    tokenizer.save(str(path / "tokenizer.json"))
    return tokenizer


def test_text_encoded_with_a_local_tokenizer(tmp_path, capsys):
    """prepare-data --tokenizer DIR: every cache block is the tokenizer's encoding of its file at
    the recorded offset, meta.json records the tokenizer, and the ids are uint16 up to 65,536
    tokens, uint32 beyond; a model whose vocabulary does not cover the tokenizer's is refused."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tiny_llm.cli import main

    texts = [bytes(demo_corpus(6000, seed=s)).decode() for s in (1, 2)]
    for i, text in enumerate(texts):
        (tmp_path / f"part{i}.txt").write_text(text)
    encoder = _bpe_tokenizer(tmp_path / "bpe", texts[0])
    vocab = encoder.get_vocab_size()
    assert 256 < vocab <= 300
    run = tmp_path / "run.yaml"
    run.write_text(f"model: {{vocab_size: {vocab}}}\ndata: {{cache: {tmp_path / 'cache'}, seq_len: 16}}\n")
    assert (
        main(
            [
                "--quiet",
                "prepare-data",
                "--config",
                str(run),
                "--source",
                "text",
                "--tokenizer",
                str(tmp_path / "bpe"),
                str(tmp_path / "part0.txt"),
                str(tmp_path / "part1.txt"),
            ]
        )
        == 0
    )
    cache = TokenCache(tmp_path / "cache")
    meta = cache.meta
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == vocab
    assert meta["tokenizer"]["type"] == "huggingface" and meta["tokenizer"]["name"] == "bpe"
    assert set(meta["tokenizer"]["files"]) == {"tokenizer.json"} and meta["tokenizer"]["vocab_size"] == vocab
    ids = [np.asarray(encoder.encode(t, add_special_tokens=False).ids) for t in texts]
    assert meta["source_tokens"] == [len(i) for i in ids] and all(
        len(i) < len(t) for i, t in zip(ids, texts, strict=True)
    )
    sources, _ = cache.block_sources()
    for block in range(0, cache.n_blocks, 7):
        source, offset = sources[block]
        assert cache.tokens([block])[0].tolist() == ids[source][offset : offset + 17].tolist()

    small = tmp_path / "small.yaml"  # a model whose vocabulary the tokenizer's exceeds
    small.write_text(
        f"data: {{cache: {tmp_path / 'cache'}, seq_len: 16}}\n"
        "training: {tokens: 1024, epochs: 1, batch_size: 4, micro_batch_size: 4}\n"
    )
    capsys.readouterr()
    assert main(["train", "--config", str(small), "--run-dir", str(tmp_path / "runs/small")]) == 2
    assert (
        f"has vocab_size={vocab} but model.vocab_size=256; set model.vocab_size >= {vocab}" in capsys.readouterr().err
    )

    words = {f"w{i}": i for i in range(70_000)} | {"[UNK]": 70_000}  # beyond uint16
    wide = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    wide.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "wide").mkdir()
    wide.save(str(tmp_path / "wide/tokenizer.json"))
    (tmp_path / "words.txt").write_text(" ".join(f"w{(i * 7919) % 70_000}" for i in range(3000)))
    out = prepare_source_cache(
        DataConfig(cache=str(tmp_path / "wide-cache"), seq_len=16),
        Source("text", (tmp_path / "words.txt",), tokenizer_dir=tmp_path / "wide"),
    )
    wide_cache = TokenCache(out)
    assert wide_cache.meta["dtype"] == "uint32" and wide_cache.tokens(range(wide_cache.n_blocks)).max() >= 1 << 16


def test_tokenizer_refusals(tmp_path):
    data = DataConfig(cache=str(tmp_path / "cache"), seq_len=16)
    (tmp_path / "a.txt").write_text("some text " * 100)
    with pytest.raises(ValueError, match=r"tokenizer gpt2/tokenizer is not a local directory; it looks like a hub id"):
        prepare_source_cache(data, Source("text", (tmp_path / "a.txt",), tokenizer_dir="gpt2/tokenizer"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no tokenizer.json; save a fast tokenizer there"):
        prepare_source_cache(data, Source("text", (tmp_path / "a.txt",), tokenizer_dir=tmp_path / "empty"))
    with pytest.raises(ValueError, match="a tokenizer applies to source text only"):
        prepare_source_cache(data, Source("demo", tokenizer_dir=tmp_path / "empty"), capacity=256)
    assert not (tmp_path / "cache").exists()
