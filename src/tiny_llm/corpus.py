"""Token sources for a cache: the built-in demo corpus, UTF-8 text files, existing token arrays."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from tiny_llm.io import sha256_file

__all__ = ["BYTE_TOKENIZER", "DEMO_GENERATOR_VERSION", "demo_corpus", "read_text_files", "read_token_files"]

BYTE_TOKENIZER = {"type": "byte", "vocab_size": 256, "description": "UTF-8 bytes; token id = byte value"}
DEMO_GENERATOR_VERSION = 1

_NAMES = ["ada", "bo", "cy", "di", "eli", "fay", "gus", "hana", "ivo", "jo"]
_NOUNS = {"cat": "animal", "dog": "animal", "fox": "animal", "owl": "animal", "apple": "food",
          "bread": "food", "soup": "food", "plum": "food", "book": "thing", "lamp": "thing", "cup": "thing"}
_VERBS = {"animal": ["sees", "chases", "feeds", "hears"], "food": ["eats", "cooks", "buys", "tastes"],
          "thing": ["reads", "finds", "holds", "moves"]}
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
        b'di finds the red book.\\nd'
    """
    rng = random.Random(seed)
    makers = [_sentence] * 6 + [_arithmetic] * 3 + [_counting]
    parts, length = [], 0
    while length < n_tokens:
        line = rng.choice(makers)(rng) + "\n"
        parts.append(line)
        length += len(line)
    return np.frombuffer("".join(parts).encode("ascii")[:n_tokens], dtype=np.uint8).copy()


def read_text_files(paths: list[Path]) -> tuple[list[np.ndarray], list[dict]]:
    """Byte-tokenise UTF-8 text files; one segment per file.

    Raises:
        ValueError: a file that is missing or not valid UTF-8.
    """
    segments, records = [], []
    for path in paths:
        path = Path(path)
        try:
            data = path.read_bytes()
            data.decode("utf-8")
        except FileNotFoundError:
            raise ValueError(f"text file {path} does not exist") from None
        except UnicodeDecodeError as error:
            raise ValueError(f"text file {path} is not valid UTF-8 ({error}); convert it first") from None
        segments.append(np.frombuffer(data, dtype=np.uint8).copy())
        records.append({"path": str(path), "bytes": len(data), "sha256": sha256_file(path)})
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
                raise ValueError(f"token file {path}: size {path.stat().st_size} bytes is not a multiple of "
                                 f"{itemsize} ({dtype}); is --token-dtype right?")
            array = np.fromfile(path, dtype=np.dtype(dtype).newbyteorder("<"))
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise ValueError(f"token file {path}: expected a 1-D integer array, got {array.dtype} {array.shape}")
        if array.size and (array.min() < 0 or array.max() >= vocab_size):
            raise ValueError(f"token file {path}: ids must lie in [0, {vocab_size}) (--vocab-size), "
                             f"found [{array.min()}, {array.max()}]")
        segments.append(array.astype(np.int64))
        records.append({"path": str(path), "tokens": int(array.size), "sha256": sha256_file(path)})
    return segments, records
