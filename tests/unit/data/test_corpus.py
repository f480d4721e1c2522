"""Token sources: demo corpus determinism, text and token-array readers, source dispatch."""

import numpy as np
import pytest

from tiny_llm.config import DataConfig
from tiny_llm.data.corpus import demo_corpus, prepare_source_cache, read_text_files, read_token_files
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
    cache = TokenCache(prepare_source_cache(data, "tokens", [tmp_path / "ids.npy"], vocab_size=70000))
    source, offset = cache.block_sources()[0][0]
    assert cache.meta["dtype"] == "uint32" and cache.tokens([0])[0, 1].item() == (offset + 1) * 7 % 70000


def test_source_dispatch_errors(tmp_path):
    data = DataConfig(cache=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="expected one of 'demo', 'text', 'tokens', got 'web'"):
        prepare_source_cache(data, "web")
    with pytest.raises(ValueError, match="source text needs input files"):
        prepare_source_cache(data, "text")
    with pytest.raises(ValueError, match="source demo needs a capacity"):
        prepare_source_cache(data, "demo")
