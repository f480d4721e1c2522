"""Writing a token cache: every block of every source is a candidate; unless the order is kept, the
blocks are permuted with a seed derived from ``data.seed`` before the blocks training and one unseen
epoch need are kept, so the cache samples the whole of the sources. Shards, the block map and
meta.json are written into a hidden folder renamed into place; an existing cache with the same
settings is reused. The cache and the stream read from it: :mod:`tiny_llm.data.tokens`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tiny_llm.data.tokens import (
    BLOCK_SOURCES,
    CACHE_FORMAT,
    PREPARE_STREAM,
    TokenCache,
    blocks_for_tokens,
    group_permutation,
)
from tiny_llm.io import atomic_directory, sha256_file

__all__ = ["Blocking", "prepare_cache"]


def _source_blocks(segments: list[np.ndarray], seq_len: int) -> np.ndarray:
    """Every block the sources hold, in source order: rows ``(source, token offset)``."""
    rows = [
        np.stack([np.full(n, i, dtype=np.int64), np.arange(n, dtype=np.int64) * seq_len], axis=1)
        for i, segment in enumerate(segments)
        if (n := max(len(segment) - 1, 0) // seq_len)
    ]
    return np.concatenate(rows) if rows else np.zeros((0, 2), dtype=np.int64)


def _select_blocks(
    segments: list[np.ndarray], seq_len: int, blocks: int | None, G: int, shuffle_seed: int | None, what: str
) -> np.ndarray:
    """The ``(source, offset)`` rows of the cache's blocks in cache order: all blocks of the
    sources, permuted with ``shuffle_seed`` (None keeps source order), then the first ``blocks``
    (None: every whole shuffle group)."""
    table = _source_blocks(segments, seq_len)
    available = len(table)
    if blocks is None:
        blocks = available // G * G
    if available < blocks or blocks == 0:
        need = max(blocks, G)
        raise ValueError(
            f"{what} holds {available} blocks of {seq_len + 1} tokens ({available * seq_len:,} tokens) "
            f"but the cache needs {need} ({need * seq_len:,} tokens); supply more data, or lower "
            "data.prepare_train_tokens and with it training.tokens"
        )
    if shuffle_seed is not None:
        table = table[group_permutation(shuffle_seed, PREPARE_STREAM, 0, available)]
    return table[:blocks]


def _write_shards(
    folder: Path,
    segments: list[np.ndarray],
    table: np.ndarray,
    seq_len: int,
    shard_blocks: int,
    dtype: np.dtype,
    shuffled: bool,
) -> list[dict]:
    """Write the blocks ``table`` names as shards of at most ``shard_blocks`` blocks. In source order
    a shard is one stretch of a source (blocks share their lookahead, a new shard starts where a
    source does); shuffled, every block is written with its own lookahead token."""
    runs: list[np.ndarray] = []
    if shuffled:
        for first in range(0, len(table), shard_blocks):
            rows = table[first : first + shard_blocks]
            runs.append(np.concatenate([segments[i][o : o + seq_len + 1] for i, o in rows]))
    else:
        first = 0
        while first < len(table):
            source, offset = table[first]
            n = 1
            while n < shard_blocks and first + n < len(table) and table[first + n, 0] == source:
                n += 1
            runs.append(segments[source][offset : offset + n * seq_len + 1])
            first += n
    entries = []
    for i, run in enumerate(runs):
        file = folder / f"shard-{i:05d}.bin"
        with open(file, "wb") as handle:
            handle.write(np.asarray(run).astype(dtype).tobytes())
            handle.flush()
            os.fsync(handle.fileno())
        entries.append({"file": file.name, "tokens": int(len(run)), "sha256": sha256_file(file)})
    return entries


def _existing(out: Path, settings: dict[str, Any], shard_blocks: int) -> bool:
    """Whether ``out`` is a cache with these settings already (verified); an empty folder is removed.

    Raises:
        ValueError: ``out`` exists with other contents or settings, naming them.
    """
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()  # an empty folder (Snakemake makes output folders before the job runs)
    if out.exists():
        meta_path = out / "meta.json"
        old = json.loads(meta_path.read_text()) if meta_path.exists() else None
        if (
            old is not None
            and all(old.get(k) == v for k, v in settings.items())
            and old.get("shard_blocks") == shard_blocks
        ):
            TokenCache(out)  # verifies shard sizes
            return True
        differ = sorted(k for k, v in settings.items() if old is not None and old.get(k) != v)
        raise ValueError(
            f"{out} already exists with other contents or settings"
            f"{' (' + ', '.join(differ) + ')' if differ else ''}; choose a new cache directory or "
            "remove the old one"
        )
    return False


def _write_cache(
    tmp: Path, segments: list[np.ndarray], table: np.ndarray, settings: dict, shard_blocks: int, keep_order: bool
) -> None:
    """The shards, the block map and meta.json (last) of a cache into ``tmp``."""
    seq_len = settings["seq_len"]
    dtype = np.dtype("<u2") if settings["vocab_size"] <= 1 << 16 else np.dtype("<u4")
    entries = _write_shards(tmp, segments, table, seq_len, shard_blocks, dtype, shuffled=not keep_order)
    with open(tmp / BLOCK_SOURCES, "wb") as handle:
        np.save(handle, table, allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())
    meta = {
        "format": CACHE_FORMAT,
        **settings,
        "dtype": dtype.name,
        "shard_blocks": shard_blocks,
        "block_stride": seq_len if keep_order else seq_len + 1,
        "blocks": int(len(table)),
        "source_tokens": [int(len(segment)) for segment in segments],
        "block_sources": {"file": BLOCK_SOURCES, "sha256": sha256_file(tmp / BLOCK_SOURCES)},
        "shards": entries,
    }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


@dataclass(frozen=True, kw_only=True)
class Blocking:
    """How a cache cuts its sources: blocks of ``seq_len`` + 1 tokens in shuffle groups of
    ``shuffle_group_blocks`` blocks, permuted with a seed derived from ``data_seed``, the first
    ``prepare_train_tokens`` (rounded up to whole groups; None: every whole group) kept, written
    ``shard_blocks`` blocks a shard."""

    seq_len: int
    shuffle_group_blocks: int
    data_seed: int
    prepare_train_tokens: int | None
    shard_blocks: int


def prepare_cache(
    out: str | Path,
    segments: list[np.ndarray],
    *,
    tokenizer: dict,
    vocab_size: int,
    blocking: Blocking,
    source: dict,
    keep_order: bool = False,
) -> Path:
    """Write a cache atomically: shards, the block map and meta.json go to a temporary folder
    renamed onto ``out``.

    Every block of every source is a candidate; unless ``keep_order``, they are permuted with a
    seed derived from ``data_seed`` before the first ``prepare_train_tokens`` (rounded up to whole
    shuffle groups of blocks) are kept, so the cache samples the whole of the sources. An existing
    cache with identical settings is reused.

    Raises:
        ValueError: ``out`` exists with other settings, or the source is too short.
    """
    seq_len, data_seed, shard_blocks = blocking.seq_len, blocking.data_seed, blocking.shard_blocks
    prepare_train_tokens = blocking.prepare_train_tokens
    out = Path(out)
    G = blocking.shuffle_group_blocks
    blocks = None if prepare_train_tokens is None else blocks_for_tokens(prepare_train_tokens, seq_len, G)
    order = (
        {"shuffled": False}
        if keep_order
        else {"shuffled": True, "unit": "block", "seed": data_seed, "stream": PREPARE_STREAM}
    )
    settings = {
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "shuffle_group_blocks": G,
        "data_seed": data_seed,
        "prepare_train_tokens": prepare_train_tokens,
        "tokenizer": tokenizer,
        "source": source,
        "order": order,
    }
    if _existing(out, settings, shard_blocks):
        return out
    what = "the demo source" if source.get("kind") == "demo" else "the source"
    table = _select_blocks(segments, seq_len, blocks, G, None if keep_order else data_seed, what)
    with atomic_directory(out) as tmp:
        _write_cache(tmp, segments, table, settings, shard_blocks, keep_order)
    return out
