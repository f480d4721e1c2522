"""Token sources for a cache: the built-in demo corpus, UTF-8 text files, existing token arrays."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tiny_llm.config import DataConfig, RunConfig
from tiny_llm.data.preparation import Blocking, prepare_cache
from tiny_llm.data.tokens import blocks_for_tokens, capacity_blocks
from tiny_llm.io import local_directory, sha256_file

__all__ = [
    "BYTE_TOKENIZER",
    "DEMO_GENERATOR_VERSION",
    "Source",
    "TOKENIZER_FILES",
    "byte_tokenizer",
    "default_capacity",
    "demo_corpus",
    "describe_tokenizer",
    "prepare_source_cache",
    "read_text_files",
    "read_token_files",
    "read_tokenizer",
    "same_tokenizer",
    "tokenizer_files",
    "write_hf_tokenizer",
]

BYTE_TOKENIZER = {"type": "byte", "vocab_size": 256, "description": "UTF-8 bytes; token id = byte value"}
DEMO_GENERATOR_VERSION = 1

_NAMES = ["ada", "bo", "cy", "di", "eli", "fay", "gus", "hana", "ivo", "jo"]
_NOUNS = {
    "cat": "animal",
    "dog": "animal",
    "fox": "animal",
    "owl": "animal",
    "apple": "food",
    "bread": "food",
    "soup": "food",
    "plum": "food",
    "book": "thing",
    "lamp": "thing",
    "cup": "thing",
}
_VERBS = {
    "animal": ["sees", "chases", "feeds", "hears"],
    "food": ["eats", "cooks", "buys", "tastes"],
    "thing": ["reads", "finds", "holds", "moves"],
}
_ADJECTIVES = ["red", "small", "big", "old", "quick", "lazy", "warm", "green"]
_PLACES = ["in the garden", "at home", "by the river", "on the hill", "in town"]


def _sentence(rng: random.Random) -> str:
    # The verb depends on the object's category and adjectives follow a Zipf-like law, so a
    # model can lower its loss by learning agreement, frequencies and spelling.
    noun = rng.choice(list(_NOUNS))
    verb = rng.choice(_VERBS[_NOUNS[noun]])
    adjective = _ADJECTIVES[min(int(rng.expovariate(0.7)), len(_ADJECTIVES) - 1)]
    tail = f" {rng.choice(_PLACES)}" if rng.random() < 0.4 else ""
    return f"{rng.choice(_NAMES)} {verb} the {adjective} {noun}{tail}."


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randrange(20), rng.randrange(20)
    return f"{a} + {b} = {a + b}." if rng.random() < 0.6 else f"{a + b} - {b} = {a}."


def _counting(rng: random.Random) -> str:
    start, step = rng.randrange(10), rng.choice([1, 2, 3])
    return " ".join(str(start + step * i) for i in range(rng.randint(3, 7))) + "."


def demo_corpus(n_tokens: int, seed: int) -> np.ndarray:
    """Deterministic synthetic ASCII text of exactly ``n_tokens`` bytes (uint8 array).

    Lines are sentences from a small grammar with agreement, arithmetic facts and counting
    sequences, mixed 6:3:1; the same (n_tokens, seed) always gives the same bytes.

    Example:
        >>> bytes(demo_corpus(24, seed=0))
        b'13 + 1 = 14.\\n27 - 12 = 1'
    """
    rng = random.Random(seed)
    makers = [_sentence] * 6 + [_arithmetic] * 3 + [_counting]
    parts, length = [], 0
    while length < n_tokens:
        line = rng.choice(makers)(rng) + "\n"
        parts.append(line)
        length += len(line)
    return np.frombuffer("".join(parts).encode("ascii")[:n_tokens], dtype=np.uint8).copy()


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "chat_template.jinja",
)
"""The files of a Hugging Face tokenizer (what ``save_pretrained`` writes); a model directory's
other files (weights, optimizer state) are not the tokenizer's."""


def tokenizer_files(directory: str | Path) -> dict[str, str]:
    """The sha256 of each tokenizer file in a directory (:data:`TOKENIZER_FILES` present there)."""
    path = Path(directory)
    return {name: sha256_file(path / name) for name in TOKENIZER_FILES if (path / name).is_file()}


def read_tokenizer(directory: str | Path) -> tuple[Any, dict]:
    """A Hugging Face tokenizer from a local directory's ``tokenizer.json`` (what every fast
    tokenizer's ``save_pretrained`` writes), and its record for meta.json: type, name, vocabulary
    size (added tokens included) and the sha256 of its tokenizer files (not of the directory's
    other files).

    Raises:
        ValueError: not a local directory (a hub id is refused with how to fetch it), no
            tokenizer.json, or one that tokenizers cannot read (corrupt, truncated).
    """
    from tokenizers import Tokenizer

    path = local_directory(directory, "tokenizer")
    if not (path / "tokenizer.json").exists():
        raise ValueError(
            f"tokenizer {path} has no tokenizer.json; save a fast tokenizer there "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(DIR), or tokenizers' Tokenizer.save)"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as error:  # tokenizers raises its own Exception for any unreadable file
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"{path / 'tokenizer.json'} cannot be read as a tokenizer ({first[:200]}); is it truncated? "
            "save the tokenizer again"
        ) from None
    return tokenizer, {
        "type": "huggingface",
        "name": path.name,
        "path": str(path.resolve()),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "files": tokenizer_files(path),
        "description": "tokenizer.json of a Hugging Face tokenizer; each file encoded whole, no special tokens added",
    }


def same_tokenizer(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two tokenizer records (a cache's meta.json, an imported run's) encode alike: both
    bytes, or Hugging Face tokenizers with the same tokenizer.json."""
    if not a or not b or a.get("type") != b.get("type"):
        return False
    if a["type"] == "huggingface":
        return a.get("files", {}).get("tokenizer.json") == b.get("files", {}).get("tokenizer.json") is not None
    return a["type"] == "byte"


def describe_tokenizer(record: dict[str, Any] | None) -> str:
    """A tokenizer record in a few words, for errors."""
    if not record:
        return "an unknown tokenizer"
    if record.get("type") == "huggingface":
        digest = record.get("files", {}).get("tokenizer.json", "?")[:12]
        return f"the tokenizer {record.get('path', record.get('name'))} (tokenizer.json sha256 {digest}...)"
    return {"byte": "bytes (UTF-8, id = byte value)"}.get(record.get("type"), f"{record.get('type')} tokens")


def byte_tokenizer() -> Any:
    """A ``tokenizers`` tokenizer whose ids are the UTF-8 byte values (this project's byte-level
    encoding): byte-level pre-tokenisation, a vocabulary of the 256 byte symbols, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    symbols = pre_tokenizers.ByteLevel.alphabet()
    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    assert set(vocab) == set(symbols)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what byte-level pre-tokenisation maps bytes to)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_hf_tokenizer(directory: Path, record: dict[str, Any] | None, vocab_size: int) -> bool:
    """Write the tokenizer a record describes into a Hugging Face model directory (its
    tokenizer files, or a byte-level tokenizer for bytes) so that ``AutoTokenizer`` opens it;
    False when the record names none that can be written (external token ids, a tokenizer
    directory that is gone)."""
    import shutil

    directory = Path(directory)
    if record and record.get("type") == "huggingface":
        source = Path(record.get("path", ""))
        files = [name for name in record.get("files", {}) if (source / name).is_file()]
        if "tokenizer.json" not in files:
            return False
        for name in files:
            shutil.copyfile(source / name, directory / name)
        if "tokenizer_config.json" not in files:
            (directory / "tokenizer_config.json").write_text(
                json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1_000_000}, indent=2)
                + "\n"
            )
        return True
    if record and record.get("type") == "byte":
        byte_tokenizer().save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "model_max_length": 1_000_000,
                    "clean_up_tokenization_spaces": False,
                    "description": "UTF-8 bytes; token id = byte value",
                },
                indent=2,
            )
            + "\n"
        )
        return True
    return False


def read_text_files(paths: list[Path], tokenizer: Any = None) -> tuple[list[np.ndarray], list[dict]]:
    """Tokenise UTF-8 text files, one segment per file: into bytes, or with ``tokenizer`` (from
    :func:`read_tokenizer`; each file encoded whole, without special tokens).

    Raises:
        ValueError: a file that is missing or not valid UTF-8.
    """
    segments, records = [], []
    for path in paths:
        path = Path(path)
        try:
            data = path.read_bytes()
            text = data.decode("utf-8")
        except FileNotFoundError:
            raise ValueError(f"text file {path} does not exist") from None
        except UnicodeDecodeError as error:
            raise ValueError(f"text file {path} is not valid UTF-8 ({error}); convert it first") from None
        record = {"path": str(path), "bytes": len(data), "sha256": sha256_file(path)}
        if tokenizer is None:
            segments.append(np.frombuffer(data, dtype=np.uint8).copy())
        else:
            segments.append(np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64))
            record["tokens"] = int(len(segments[-1]))
        records.append(record)
    return segments, records


def read_token_files(paths: list[Path], dtype: str, vocab_size: int) -> tuple[list[np.ndarray], list[dict]]:
    """Read existing token arrays (``.npy``, or raw little-endian ``.bin`` of ``dtype``); one segment each.

    Raises:
        ValueError: unreadable file, wrong element size, or ids outside [0, vocab_size).
    """
    segments, records = [], []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ValueError(f"token file {path} does not exist")
        if path.suffix == ".npy":
            array = np.load(path, allow_pickle=False)
        else:
            itemsize = np.dtype(dtype).itemsize
            if path.stat().st_size % itemsize:
                raise ValueError(
                    f"token file {path}: size {path.stat().st_size} bytes is not a multiple of "
                    f"{itemsize} ({dtype}); is --token-dtype right?"
                )
            array = np.fromfile(path, dtype=np.dtype(dtype).newbyteorder("<"))
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise ValueError(f"token file {path}: expected a 1-D integer array, got {array.dtype} {array.shape}")
        if array.size and (array.min() < 0 or array.max() >= vocab_size):
            raise ValueError(
                f"token file {path}: ids must lie in [0, {vocab_size}) (--vocab-size), "
                f"found [{array.min()}, {array.max()}]"
            )
        segments.append(array.astype(np.int64))
        records.append({"path": str(path), "tokens": int(array.size), "sha256": sha256_file(path)})
    return segments, records


def _file_sources(source: Source) -> tuple[list, dict[str, Any], int, dict[str, Any]]:
    """The token segments of text or token files, their tokenizer record, vocabulary and provenance."""
    inputs, vocab_size = list(source.inputs), source.vocab_size
    if not inputs:
        raise ValueError(f"source {source.kind} needs input files")
    if source.kind == "text" and source.tokenizer_dir is not None:
        encoder, tokenizer = read_tokenizer(source.tokenizer_dir)
        segments, files = read_text_files(inputs, encoder)
        vocab = tokenizer["vocab_size"]
    elif source.kind == "text":
        segments, files = read_text_files(inputs)
        tokenizer, vocab = BYTE_TOKENIZER, 256
    else:
        segments, files = read_token_files(inputs, source.token_dtype, vocab_size)
        tokenizer = {"type": "external", "vocab_size": vocab_size, "description": source.tokenizer_description}
        vocab = vocab_size
    return segments, tokenizer, vocab, {"kind": source.kind, "files": files}


def _demo_source(data: DataConfig, inputs: list[Path], capacity: int | None, seed: int) -> tuple:
    """The demo source's one segment (enough blocks for ``capacity`` tokens), byte tokenizer and
    provenance."""
    if inputs:
        raise ValueError("source demo takes no input files")
    if capacity is None:
        raise ValueError("source demo needs a capacity: set data.prepare_train_tokens")
    blocks = blocks_for_tokens(capacity, data.seq_len, data.shuffle_group_blocks)
    provenance = {"kind": "demo", "seed": seed, "generator_version": DEMO_GENERATOR_VERSION}
    return [demo_corpus(blocks * data.seq_len + 1, seed)], BYTE_TOKENIZER, 256, provenance


@dataclass(frozen=True)
class Source:
    """What a cache is prepared from: ``kind`` demo | text | tokens and its ``inputs`` (files; none
    for the demo). The demo's text is generated from ``demo_seed``. Text is byte-tokenised, or
    encoded with the Hugging Face tokenizer in ``tokenizer_dir``. Token files (.npy, or raw
    little-endian ``token_dtype``) hold ids below ``vocab_size`` of a tokenizer described by
    ``tokenizer_description``."""

    kind: str
    inputs: tuple[Path, ...] = ()
    demo_seed: int = 0
    tokenizer_dir: str | Path | None = None
    token_dtype: str = "uint16"
    vocab_size: int = 256
    tokenizer_description: str = ""


def prepare_source_cache(
    data: DataConfig,
    source: Source,
    *,
    capacity: int | None = None,
    out: str | Path | None = None,
    shard_tokens: int = 1 << 20,
    keep_order: bool = False,
) -> Path:
    """Prepare the cache ``data`` describes from ``source`` (its tokenizer recorded in meta.json; ids
    stored as uint16 when the vocabulary allows, else uint32).

    Uses the data section's seq_len, shuffle_group_blocks and seed; the sequences of all sources
    are shuffled with that seed unless ``keep_order``. ``capacity`` (training
    tokens, rounded up to whole shuffle groups) defaults to ``data.prepare_train_tokens``; the demo
    source needs one (``default_capacity`` gives what a run plus one unseen epoch need), file
    sources without one keep every whole shuffle group they hold.

    Raises:
        ValueError: an unknown source, missing or unreadable inputs, or too little data.
    """
    if source.tokenizer_dir is not None and source.kind != "text":
        raise ValueError(f"a tokenizer applies to source text only, not {source.kind!r}")
    capacity = capacity if capacity is not None else data.prepare_train_tokens
    if source.kind == "demo":
        segments, tokenizer, vocab, provenance = _demo_source(data, list(source.inputs), capacity, source.demo_seed)
    elif source.kind in ("text", "tokens"):
        segments, tokenizer, vocab, provenance = _file_sources(source)
    else:
        raise ValueError(f"source: expected one of 'demo', 'text', 'tokens', got {source.kind!r}")
    return prepare_cache(
        out or data.cache,
        segments,
        tokenizer=tokenizer,
        vocab_size=vocab,
        blocking=Blocking(
            seq_len=data.seq_len,
            shuffle_group_blocks=data.shuffle_group_blocks,
            data_seed=data.seed,
            prepare_train_tokens=capacity,
            shard_blocks=max(1, shard_tokens // data.seq_len),
        ),
        source=provenance,
        keep_order=keep_order,
    )


def default_capacity(config: RunConfig) -> int:
    """Training tokens a cache needs for this run plus one unseen analysis epoch
    (``data.prepare_train_tokens`` when set)."""
    if config.data.prepare_train_tokens is not None:
        return config.data.prepare_train_tokens
    return capacity_blocks(config)["unseen"] * config.data.seq_len
