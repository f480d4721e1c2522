"""Token cache and stream: blocks, shards, shuffle groups, seen/unseen plans, capacity."""

import json

import numpy as np
import pytest
from builders import make_oracle_run, make_run_config, small_cache

from tiny_llm.config import config_from_dict, config_to_dict
from tiny_llm.data.tokens import (
    TokenCache,
    capacity_blocks,
    check_capacity,
    epoch_plan,
    group_permutation,
    stream_batches,
    unseen_plan,
)
from tiny_llm.io import sha256_file


def test_blocks_overlap_by_one_token_and_never_cross_shards(tmp_path):
    segments = [np.arange(0, 30), np.arange(100, 118)]  # 7 blocks + 4 blocks of 5 tokens
    cache = TokenCache(small_cache(tmp_path / "c", segments, G=1, keep_order=True))
    assert not cache.shuffled and cache.stride == 4
    assert [len(s) for s in cache.shards] == [17, 13, 17]  # 4 + 3 blocks, then 4 blocks, +1 lookahead each
    assert cache.n_blocks == 11
    tokens = cache.tokens(np.arange(cache.n_blocks)).numpy()
    assert tokens.shape == (11, 5)
    for j in range(cache.n_blocks):
        shard, offset = cache.position(j)
        assert offset + 5 <= len(cache.shards[shard])  # the whole block lies inside its shard
        if j + 1 < cache.n_blocks and cache.position(j + 1)[0] == shard:
            assert tokens[j, -1] == tokens[j + 1, 0]  # one shared lookahead token
    assert tokens[6, -1] == 28 and tokens[7, 0] == 100  # a new segment starts a new shard
    # Inside a segment the targets of consecutive blocks tile it without gaps or overlap.
    targets = tokens[:7, 1:].ravel()
    assert np.array_equal(targets, np.arange(1, 29))
    assert cache.position(7) == (2, 0) and cache.position(3) == (0, 12)
    with pytest.raises(IndexError):
        cache.position(11)
    sources, lengths = cache.block_sources()
    assert sources.tolist() == [[0, 4 * j] for j in range(7)] + [[1, 4 * j] for j in range(4)]
    assert lengths.tolist() == [30, 18]


def test_shuffled_blocks_carry_their_own_lookahead_and_map_back_to_their_sources(tmp_path):
    segments = [np.arange(0, 30), np.arange(100, 118)]
    cache = TokenCache(small_cache(tmp_path / "c", segments, G=1, seed=5))
    assert (
        cache.shuffled
        and cache.stride == 5
        and cache.meta["order"] == {"shuffled": True, "unit": "block", "seed": 5, "stream": 2}
    )
    assert [len(s) for s in cache.shards] == [20, 20, 15]  # 4 + 4 + 3 blocks of 5 tokens
    tokens = cache.tokens(np.arange(cache.n_blocks)).numpy()
    sources, _ = cache.block_sources()
    for row, (source, offset) in zip(tokens, sources, strict=True):
        assert np.array_equal(row, segments[source][offset : offset + 5])  # every block intact, from its source
    # Every block of the sources appears once, in a permuted order.
    assert sorted(map(tuple, sources.tolist())) == [(0, 4 * j) for j in range(7)] + [(1, 4 * j) for j in range(4)]
    assert sources.tolist() != sorted(sources.tolist())
    other = TokenCache(small_cache(tmp_path / "d", segments, G=1, seed=6)).block_sources()[0]
    assert other.tolist() != sources.tolist()  # the order follows the data seed


def test_truncated_shard_is_refused(tmp_path):
    path = small_cache(tmp_path / "c", [np.arange(50)], capacity=20)
    shard = path / "shard-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ValueError, match="truncated or missing"):
        TokenCache(path)


def test_group_permutation_is_deterministic_and_seeded():
    p = group_permutation(5, 0, 2, 64)
    assert sorted(p) == list(range(64))
    assert np.array_equal(p, group_permutation(5, 0, 2, 64))
    assert not np.array_equal(p, group_permutation(6, 0, 2, 64))
    assert not np.array_equal(p, group_permutation(5, 1, 2, 64))
    assert not np.array_equal(p, group_permutation(5, 0, 3, 64))
    # Golden values: the permutation is part of the data contract and must never drift.
    assert group_permutation(1234, 0, 0, 8).tolist() == GOLDEN_PERMUTATION


GOLDEN_PERMUTATION = [2, 7, 6, 1, 3, 0, 5, 4]


def test_stream_reads_each_group_as_a_permutation(tmp_path):
    config = make_run_config(tmp_path / "cache")  # B=4, G=4, 3 batches per epoch, 2 epochs
    blocks = stream_batches(config, 0, config.total_batches).ravel()
    G = config.data.shuffle_group_blocks
    for g in range(len(blocks) // G):
        assert sorted(blocks[g * G : (g + 1) * G]) == list(range(g * G, (g + 1) * G))
    assert not np.array_equal(blocks, np.arange(len(blocks)))


def test_epoch_plans_are_consecutive_stretches_of_one_stream(tmp_path):
    config = make_run_config(tmp_path / "cache")
    S = config.steps_per_epoch
    stream = stream_batches(config, 0, config.total_batches)
    for epoch in (1, 2):
        plan = epoch_plan(config, epoch)
        assert np.array_equal(plan.blocks, stream[(epoch - 1) * S : epoch * S])
        assert plan.stream_batches.tolist() == list(range((epoch - 1) * S, epoch * S))
    with pytest.raises(ValueError, match=r"epoch must lie in \[1, 2\]"):
        epoch_plan(config, 3)


def test_unseen_starts_after_the_final_group_training_could_draw_from(tmp_path):
    # 2 epochs x 3 batches x B=5 = 30 positions; G=4 -> training may draw from blocks 0..31.
    config = make_run_config(tmp_path / "cache", batch_size=5, micro_batch_size=5, tokens=5 * 8 * 3 * 2)
    need = capacity_blocks(config)
    assert need == {"train": 32, "unseen": 32 + 16}
    trained = stream_batches(config, 0, config.total_batches).ravel()
    assert trained.max() < 32 and len(set(trained)) == 30
    unseen = unseen_plan(config)
    assert unseen.blocks.shape == (3, 5)
    assert unseen.blocks.min() >= 32 and unseen.blocks.max() < 48
    assert not set(unseen.blocks.ravel()) & set(trained)
    # The unseen stream is shuffled with its own seed, not the training permutation shifted.
    shifted = stream_batches(config, 0, 3, start_block=32)
    assert not np.array_equal(unseen.blocks, shifted)


def test_capacity_error_says_what_tosmall_cache(tmp_path):
    config = make_run_config(tmp_path / "cache")
    need = capacity_blocks(config)
    small_cache(tmp_path / "cache", [np.arange(1000) % 256], seq_len=8, G=4, capacity=need["train"] * 8, vocab=256)
    cache = TokenCache(tmp_path / "cache")
    check_capacity(cache, config, "train")
    with pytest.raises(ValueError) as error:
        check_capacity(cache, config, "unseen")
    tokens = need["unseen"] * 8
    assert f"data.prepare_train_tokens={tokens}" in str(error.value)
    assert f"holds {need['train']} blocks but training plus one unseen epoch needs {need['unseen']}" in str(error.value)
    assert "lower training.tokens" in str(error.value)
    # The suggested command works as written (with the user's files filled in).
    import re

    import yaml

    from tiny_llm.cli import main
    from tiny_llm.config import config_to_dict

    suggested = re.search(r"\(tiny-llm (prepare-data .*?)\)", str(error.value)).group(1).split()
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config_to_dict(config)))
    np.save(tmp_path / "ids.npy", (np.arange(5 * tokens) % 256).astype(np.uint16))
    fill = {
        "RUN.yaml": str(tmp_path / "run.yaml"),
        "NEW_CACHE": str(tmp_path / "bigger"),
        "text|tokens": "tokens",
        "FILES...": str(tmp_path / "ids.npy"),
    }
    assert main(["--quiet", *[fill.get(word, word) for word in suggested]]) == 0
    check_capacity(TokenCache(tmp_path / "bigger"), config, "unseen")


def test_packed_worker_plans_interleave(tmp_path):
    config = make_run_config(tmp_path / "cache", tokens=4 * 8 * 4 * 2, packed={"workers": 2})
    plan = epoch_plan(config, 1)
    w0, w1 = plan.worker(0, 2), plan.worker(1, 2)
    assert w0.stream_batches.tolist() == [0, 2] and w1.stream_batches.tolist() == [1, 3]
    assert np.array_equal(w1.blocks, plan.blocks[[1, 3]])


def _oracle_cache(tmp_path):
    config = make_oracle_run(tmp_path)
    return config, TokenCache(config.data.cache)


def test_changed_shard_bytes_are_refused_and_verification_is_recorded(tmp_path, monkeypatch):
    import tiny_llm.data.tokens as data

    config, cache = _oracle_cache(tmp_path)
    hashed = []
    monkeypatch.setattr(data, "sha256_file", lambda path: (hashed.append(path), sha256_file(path))[1])
    cache.check_layout(config)
    assert len(hashed) == len(cache.meta["shards"])  # every shard hashed once ...
    TokenCache(config.data.cache).check_layout(config)
    assert len(hashed) == len(cache.meta["shards"])  # ... and not again while unchanged
    shard = cache.path / cache.meta["shards"][1]["file"]
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 1  # same length, other bytes
    shard.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"shard-00001.bin changed after preparation .*prepare the cache again"):
        TokenCache(config.data.cache).check_layout(config)


def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path):
    config, cache = _oracle_cache(tmp_path)
    small = config_from_dict({**config_to_dict(config), "model": {**config_to_dict(config)["model"], "vocab_size": 16}})
    cache.check_layout(small)
    ids = np.full(cache.meta["shards"][0]["tokens"], 20, dtype=cache.dtype)  # made outside prepare-data
    shard = cache.path / cache.meta["shards"][0]["file"]
    shard.write_bytes(ids.tobytes())
    meta = json.loads((cache.path / "meta.json").read_text())
    meta["shards"][0]["sha256"] = sha256_file(shard)
    (cache.path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="holds token id 20, beyond model.vocab_size=16"):
        TokenCache(config.data.cache).check_layout(small)


@pytest.mark.parametrize(
    "text, message",
    [("{not json", r"meta.json is not valid JSON \("), ('{"format": 1}', r"meta.json lacks seq_len, dtype, shards")],
)
def test_damaged_meta_json_names_the_file(tmp_path, text, message):
    config, cache = _oracle_cache(tmp_path)
    (cache.path / "meta.json").write_text(text)
    with pytest.raises(ValueError, match=message):
        TokenCache(cache.path)
