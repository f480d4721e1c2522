"""Preparing a cache: which blocks of the sources it keeps (all sources sampled when shuffled, whole
groups plus the lookahead), atomically written and reused when identical."""

import json

import numpy as np
import pytest
from builders import small_cache

from tiny_llm.data.tokens import TokenCache, blocks_for_tokens


def test_shuffled_cache_spans_the_sources_even_when_it_keeps_only_part(tmp_path):
    segments = [np.arange(i * 1000, i * 1000 + 401) for i in range(3)]  # 3 sources of 100 blocks
    cache = TokenCache(small_cache(tmp_path / "c", segments, capacity=240, G=3, shard_blocks=100))
    sources, _ = cache.block_sources()
    assert cache.n_blocks == 60 and set(sources[:, 0].tolist()) == {0, 1, 2}
    kept = TokenCache(small_cache(tmp_path / "k", segments, capacity=240, G=3, shard_blocks=100, keep_order=True))
    assert set(kept.block_sources()[0][:, 0].tolist()) == {0}  # in source order only the first file


def test_preparation_rounds_up_to_whole_groups_plus_lookahead(tmp_path):
    cache = TokenCache(small_cache(tmp_path / "c", [np.arange(200)], capacity=27, shard_blocks=100, keep_order=True))
    # ceil(27 / 4) = 7 blocks -> 9 (three groups of 3), plus the lookahead token.
    assert cache.n_blocks == 9 == blocks_for_tokens(27, 4, 3)
    assert cache.meta["shards"][0]["tokens"] == 9 * 4 + 1
    shuffled = TokenCache(small_cache(tmp_path / "s", [np.arange(200)], capacity=27, shard_blocks=100))
    assert shuffled.n_blocks == 9 and shuffled.meta["shards"][0]["tokens"] == 9 * 5  # a lookahead per block
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert meta["tokenizer"]["type"] == "byte" and meta["dtype"] == "uint16" and meta["prepare_train_tokens"] == 27


def test_preparation_is_atomic_and_reusable(tmp_path):
    with pytest.raises(ValueError, match="the source holds 2 blocks"):
        small_cache(tmp_path / "c", [np.arange(10)], capacity=40)
    assert list(tmp_path.iterdir()) == []  # nothing left behind
    small_cache(tmp_path / "c", [np.arange(50)], capacity=20)
    before = (tmp_path / "c" / "shard-00000.bin").stat().st_mtime_ns
    small_cache(tmp_path / "c", [np.arange(50)], capacity=20)  # identical: reused
    assert (tmp_path / "c" / "shard-00000.bin").stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="already exists with other contents or settings"):
        small_cache(tmp_path / "c", [np.arange(50)], capacity=12)
