"""Token cache (meta.json + raw shards) and the token stream: blocks, shuffle groups, batch plans.

Stream semantics (the contract analysis relies on):

* A block is ``seq_len + 1`` tokens (inputs and the targets shifted by one). Block j of a shard
  starts at token ``j * stride``: in a cache prepared in source order (``stride = seq_len``)
  neighbouring blocks share one token (the lookahead) and their target positions are disjoint; in
  a shuffled cache (the default, ``stride = seq_len + 1``) every block carries its own lookahead,
  because its neighbour comes from elsewhere in the sources. Blocks never cross a shard. Blocks are
  numbered globally, shard after shard.
* Preparation cuts each source (file) into blocks at offsets ``j * seq_len`` and, unless asked to
  keep the source order, permutes all blocks of all sources with a seed derived from the data
  seed, so that consecutive blocks, and so every optimizer batch, come from all over the sources.
  ``block_sources.npy`` records, for every block in cache order, its source and token offset.
* The training stream reads blocks in shuffle groups of ``G = shuffle_group_blocks``: stream
  position p reads block ``g*G + perm_g[p % G]`` with ``g = p // G`` and ``perm_g`` a permutation
  derived from (data seed, stream id, g). Batch b is stream positions ``[b*B, (b+1)*B)``.
* Virtual epoch k (1-based) is stream batches ``[(k-1)*S, k*S)`` with S = steps_per_epoch.
* The unseen stream starts at the first block after the final shuffle group that training could
  draw from, is cut into its own groups with its own permutation (stream id 1), and one epoch of S
  batches is read from it; its final group must lie in the cache in full.
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tiny_llm.config import RunConfig
from tiny_llm.io import atomic_write_json, sha256_file
from tiny_llm.layout import epoch_stem

if TYPE_CHECKING:
    import torch

__all__ = [
    "BatchPlan",
    "TokenCache",
    "blocks_for_tokens",
    "derive_seed",
    "capacity_blocks",
    "check_capacity",
    "epoch_plan",
    "offset_plan",
    "stream_batches",
    "unseen_plan",
    "whole_groups",
]

CACHE_FORMAT = 2
READ_FORMATS = (1, 2)
"""Format 1: source order, blocks share their lookahead token, no block map. Format 2 adds
``block_stride``, ``order``, ``source_tokens`` and ``block_sources.npy``."""
BLOCK_SOURCES = "block_sources.npy"
VERIFIED_RECORD = ".verified.json"
"""Per-shard verification record kept in a cache (see ``TokenCache.verify``)."""
_META_KEYS = ("format", "seq_len", "dtype", "shards", "vocab_size", "shuffle_group_blocks", "tokenizer", "source")
TRAIN_STREAM, UNSEEN_STREAM, PREPARE_STREAM = 0, 1, 2
_MASK64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on uint64 arrays: a fixed, version-independent hash."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (SplitMix64 chain): independent streams from one user seed."""
    key = np.zeros(1, dtype=np.uint64)
    for part in parts:
        key = _splitmix64(key ^ np.uint64(part & _MASK64))
    return int(key[0] >> np.uint64(1))


@functools.lru_cache(maxsize=4096)
def group_permutation(seed: int, stream: int, group: int, size: int) -> np.ndarray:
    """The block order inside one shuffle group: argsort of hashed (seed, stream, group, index)."""
    key = np.array([seed & _MASK64], dtype=np.uint64)
    for part in (stream, group):
        key = _splitmix64(key ^ np.uint64(part & _MASK64))
    with np.errstate(over="ignore"):
        keys = _splitmix64(key + np.arange(size, dtype=np.uint64))
    order = np.argsort(keys, kind="stable")
    order.flags.writeable = False  # shared through the cache
    return order


# --- the cache ---------------------------------------------------------------------------------


class TokenCache:
    """Read-only view of a prepared cache: shards as memmaps, global block numbering."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.exists():
            raise ValueError(f"{self.path} is not a token cache (no meta.json); run `tiny-llm prepare-data` first")
        try:
            self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{meta_path} is not valid JSON ({error}); prepare the cache again") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") not in READ_FORMATS:
            found = self.meta.get("format") if isinstance(self.meta, dict) else None
            raise ValueError(
                f"{meta_path}: unsupported cache format {found!r} (this version reads "
                f"{', '.join(map(str, READ_FORMATS))})"
            )
        missing = [key for key in _META_KEYS if key not in self.meta]
        missing += [
            f"shards[{i}].{key}"
            for i, entry in enumerate(self.meta.get("shards") or [])
            for key in ("file", "tokens", "sha256")
            if not isinstance(entry, dict) or key not in entry
        ]
        if missing:
            raise ValueError(f"{meta_path} lacks {', '.join(missing)}; prepare the cache again")
        self.seq_len: int = self.meta["seq_len"]
        self.stride: int = int(self.meta.get("block_stride", self.seq_len))
        self.dtype = np.dtype(self.meta["dtype"]).newbyteorder("<")
        self.shards = [self._open_shard(entry) for entry in self.meta["shards"]]
        blocks = [max(len(s) - 1 - self.seq_len, -self.stride) // self.stride + 1 for s in self.shards]
        self.first_block = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)  # per shard

    def _open_shard(self, entry: dict) -> np.ndarray:
        file = self.path / entry["file"]
        expected = entry["tokens"] * self.dtype.itemsize
        if not file.exists() or file.stat().st_size != expected:
            size = file.stat().st_size if file.exists() else "missing"
            raise ValueError(
                f"cache shard {file} is truncated or missing ({size} bytes, expected {expected}); "
                "prepare the cache again"
            )
        return np.memmap(file, dtype=self.dtype, mode="r")

    @property
    def n_blocks(self) -> int:
        return int(self.first_block[-1])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def position(self, block: int) -> tuple[int, int]:
        """``(shard_index, token_offset)`` of a block's first input token."""
        if not 0 <= block < self.n_blocks:
            raise IndexError(f"block {block} outside the cache's {self.n_blocks} blocks")
        shard = int(np.searchsorted(self.first_block, block, side="right")) - 1
        return shard, int(block - self.first_block[shard]) * self.stride

    @property
    def shuffled(self) -> bool:
        """Whether preparation permuted the blocks of the sources (format 1 caches kept their order)."""
        return bool((self.meta.get("order") or {}).get("shuffled", False))

    def block_sources(self) -> tuple[np.ndarray, np.ndarray]:
        """Where each block came from: ``(source, offset)`` int64 arrays in cache order, and the
        sources' token counts. A format-1 cache (source order, no map) counts as one source read
        front to back."""
        if self.meta.get("format", 1) == 1:
            blocks = np.arange(self.n_blocks, dtype=np.int64)
            total = int(sum(len(s) for s in self.shards))
            return np.stack([np.zeros_like(blocks), blocks * self.seq_len], axis=1), np.array([total])
        table = np.load(self.path / BLOCK_SOURCES, allow_pickle=False)
        if table.shape != (self.n_blocks, 2):
            raise ValueError(
                f"{self.path / BLOCK_SOURCES} describes {table.shape[0]} blocks but the cache holds "
                f"{self.n_blocks}; prepare the cache again"
            )
        return table.astype(np.int64), np.asarray(self.meta["source_tokens"], dtype=np.int64)

    def tokens(self, blocks: np.ndarray | list[int]) -> torch.Tensor:
        """The blocks' tokens as int64, shape (n, seq_len + 1): inputs ``[:, :-1]``, targets ``[:, 1:]``."""
        rows = []
        for block in blocks:
            shard, offset = self.position(int(block))
            rows.append(np.asarray(self.shards[shard][offset : offset + self.seq_len + 1], dtype=np.int64))
        import torch

        return torch.from_numpy(np.stack(rows))

    def verify(self, vocab_size: int) -> None:
        """Refuse shards whose bytes differ from the sha256 that meta.json records, and token ids
        ≥ ``vocab_size`` (a cache made outside ``prepare-data``; on CUDA an out-of-range id would
        kill the job without a message).

        Each shard is hashed once per version: the result (size, modification time, hash, largest
        id) is kept in ``.verified.json`` in the cache, and a shard whose size or modification time
        changed is hashed again. A read-only cache is verified on every use.
        """
        record_path = self.path / VERIFIED_RECORD
        try:
            record = json.loads(record_path.read_text())
            record = record if isinstance(record, dict) else {}
        except (OSError, ValueError):
            record = {}
        changed = False
        for entry, shard in zip(self.meta["shards"], self.shards, strict=True):
            file = self.path / entry["file"]
            stat = file.stat()
            stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": entry["sha256"]}
            known = record.get(entry["file"])
            if not isinstance(known, dict) or {k: known.get(k) for k in stamp} != stamp or "max_token" not in known:
                digest = sha256_file(file)
                if digest != entry["sha256"]:
                    raise ValueError(
                        f"cache shard {file} changed after preparation (sha256 {digest[:16]}…, "
                        f"{self.path / 'meta.json'} records {entry['sha256'][:16]}…); prepare the "
                        "cache again"
                    )
                known = record[entry["file"]] = {**stamp, "max_token": int(shard.max()) if len(shard) else -1}
                changed = True
            if known["max_token"] >= vocab_size:
                raise ValueError(
                    f"cache shard {file} holds token id {known['max_token']}, beyond model.vocab_size="
                    f"{vocab_size}; set model.vocab_size > {known['max_token']} or prepare the cache "
                    "with a tokenizer of this vocabulary"
                )
        if changed:
            with contextlib.suppress(OSError):  # a read-only cache is verified again next time
                atomic_write_json(record_path, record)

    def check_layout(self, config: RunConfig) -> None:
        """Refuse a cache prepared for another block layout or vocabulary, or whose shards changed
        after preparation (``verify``)."""
        for key, want in (("seq_len", config.data.seq_len), ("shuffle_group_blocks", config.data.shuffle_group_blocks)):
            if self.meta[key] != want:
                raise ValueError(
                    f"cache {self.path} was prepared with {key}={self.meta[key]} but data.{key}={want}; "
                    "prepare a cache for this configuration (tiny-llm prepare-data --config ...)"
                )
        if self.vocab_size > config.model.vocab_size:
            raise ValueError(
                f"cache {self.path} has vocab_size={self.vocab_size} but model.vocab_size="
                f"{config.model.vocab_size}; set model.vocab_size >= {self.vocab_size}"
            )
        self.verify(config.model.vocab_size)


# --- capacity ----------------------------------------------------------------------------------


def whole_groups(blocks: int, shuffle_group_blocks: int) -> int:
    """``blocks`` rounded up to whole shuffle groups (the training stream reads groups whole)."""
    return -(-blocks // shuffle_group_blocks) * shuffle_group_blocks


def blocks_for_tokens(tokens: int, seq_len: int, shuffle_group_blocks: int) -> int:
    """Cache blocks that hold ``tokens`` training targets, rounded up to whole shuffle groups."""
    return whole_groups(-(-tokens // seq_len), shuffle_group_blocks)


def capacity_blocks(config: RunConfig) -> dict[str, int]:
    """Blocks that training, and training plus one unseen epoch, need (whole shuffle groups).

    ``train``: every block of every shuffle group training reads from (the final group can reach
    past the nominal budget). ``unseen``: that plus one batch-aligned epoch and its full final group.
    """
    G, B = config.data.shuffle_group_blocks, config.training.batch_size
    train = whole_groups(config.data.stream_offset + config.total_batches * B, G)
    return {"train": train, "unseen": train + whole_groups(config.steps_per_epoch * B, G)}


def check_capacity(cache: TokenCache, config: RunConfig, need: str = "train") -> None:
    """Fail before any work when the cache is too short, saying what to prepare.

    Raises:
        ValueError: with the ``data.prepare_train_tokens`` value that would suffice.
    """
    blocks = capacity_blocks(config)[need]
    if cache.n_blocks < blocks:
        tokens = capacity_blocks(config)["unseen"] * config.data.seq_len
        what = "training" if need == "train" else "training plus one unseen epoch"
        raise ValueError(
            f"cache {cache.path} holds {cache.n_blocks} blocks but {what} needs {blocks}; "
            f"prepare a new cache with data.prepare_train_tokens={tokens} (tiny-llm prepare-data "
            f"--config RUN.yaml --set data.prepare_train_tokens={tokens} --out NEW_CACHE --source "
            "text|tokens FILES...), or, if the corpus is too small for that, lower training.tokens"
        )


# --- batch plans -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchPlan:
    """The exact blocks of a run of optimizer batches, in order.

    ``blocks[i]`` are the global block ids of batch i (B sequences); ``stream_batches[i]`` is that
    batch's index in the stream it came from.
    """

    name: str
    blocks: np.ndarray  # (n_batches, B) int64
    stream_batches: np.ndarray  # (n_batches,) int64

    def __len__(self) -> int:
        return len(self.blocks)

    def positions(self, cache: TokenCache, batch: int) -> list[list[int]]:
        """``[shard, offset]`` of each sequence of batch ``batch``."""
        return [list(cache.position(int(b))) for b in self.blocks[batch]]

    def worker(self, worker: int, workers: int) -> BatchPlan:
        """Batches a packed-run worker trained on: stream batch b belongs to worker ``b % workers``."""
        keep = self.stream_batches % workers == worker
        return BatchPlan(f"{self.name}/worker-{worker:03d}", self.blocks[keep], self.stream_batches[keep])


def stream_batches(
    config: RunConfig, first: int, count: int, stream: int = TRAIN_STREAM, start_block: int = 0
) -> np.ndarray:
    """Block ids (count, B) of stream batches ``[first, first + count)``; the training stream's
    batches start after its first ``data.stream_offset`` sequences (a branch's)."""
    G, B, seed = config.data.shuffle_group_blocks, config.training.batch_size, config.data.seed
    skip = config.data.stream_offset if stream == TRAIN_STREAM else 0
    positions = np.arange(skip + first * B, skip + (first + count) * B, dtype=np.int64)
    groups = positions // G
    out = np.empty_like(positions)
    for g in np.unique(groups):
        sel = groups == g
        out[sel] = start_block + g * G + group_permutation(seed, stream, int(g), G)[positions[sel] % G]
    return out.reshape(count, B)


def epoch_plan(config: RunConfig, epoch: int) -> BatchPlan:
    """Virtual epoch ``epoch`` (1-based) of training, in training order; epoch 1 is the seen case."""
    if not 1 <= epoch <= config.training.epochs:
        raise ValueError(f"epoch must lie in [1, {config.training.epochs}], got {epoch}")
    S = config.steps_per_epoch
    first = (epoch - 1) * S
    return BatchPlan(epoch_stem(epoch), stream_batches(config, first, S), np.arange(first, first + S))


def unseen_plan(config: RunConfig) -> BatchPlan:
    """One batch-aligned epoch from the unseen stream after training's final shuffle group."""
    S = config.steps_per_epoch
    start = capacity_blocks(config)["train"]
    return BatchPlan("unseen", stream_batches(config, 0, S, UNSEEN_STREAM, start), np.arange(S))


def offset_plan(config: RunConfig, cache: TokenCache, offset: int, key: str = "data_offset") -> BatchPlan:
    """One batch-aligned epoch (S = steps_per_epoch batches of B blocks) read in cache order from
    batch ``offset`` on: batch i is blocks [(offset + i)·B, (offset + i + 1)·B). The data case of a
    model trained elsewhere, whose training stream is not known; a shuffled cache already mixes
    the corpus.

    Raises:
        ValueError: a negative offset, or an epoch reaching past the cache (naming ``key``).
    """
    S, B = config.steps_per_epoch, config.training.batch_size
    if offset < 0:
        raise ValueError(f"{key}: expected a batch offset ≥ 0, got {offset}")
    last = (offset + S) * B
    if last > cache.n_blocks:
        raise ValueError(
            f"{key}={offset}: the offset epoch ({S} batches of {B} sequences) ends at block {last}, "
            f"past the {cache.n_blocks} blocks of cache {cache.path}; lower {key} to at most "
            f"{max(cache.n_blocks // B - S, 0)}, or the epoch (training.tokens / training.epochs)"
        )
    blocks = np.arange(offset * B, last, dtype=np.int64).reshape(S, B)
    return BatchPlan(f"offset-{offset}", blocks, np.arange(offset, offset + S, dtype=np.int64))


# --- preparation -------------------------------------------------------------------------------
