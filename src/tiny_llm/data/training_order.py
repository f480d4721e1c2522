"""A suite's published training order as a token source, read in place and memory-mapped (never
copied: the Pile as Pythia trained on it is ~600 GB).

Two formats, each a sequence of fixed-length training sequences in the order they were trained,
sequence i trained at step ``i // sequences_per_step + 1``:

* ``megatron``: a GPT-NeoX/Megatron indexed dataset, ``PREFIX.idx`` (header ``MMIDIDX``, version 1,
  the token dtype's code, the sequence count, the document count, then each sequence's length
  (int32), its byte offset in the data (int64) and the document index (int64)) and ``PREFIX.bin``
  (the tokens), or Pythia's published shards ``PREFIX-000NN-of-000MM.bin`` read as one file
  without concatenating them.
* ``token_array``: flat token arrays (``.npy``, or raw files of a stated dtype) cut into instances
  of ``sequence_tokens`` tokens, in the order of the files, optionally permuted by a global index
  order (an ``.npy`` of instance indices: position in training -> instance), as OLMo publishes
  them.

Refused by name: an ``.idx`` of another version or a non-integer dtype, a data file shorter than
its index says (truncated), sequences of another length than ``sequence_tokens``, token ids beyond
the model's vocabulary (checked on every sequence read), and windows beyond the data.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tiny_llm.data.tokens import BatchPlan
from tiny_llm.declared import Positive, build

__all__ = [
    "MEGATRON_DTYPES",
    "ORDER_CASES",
    "OrderCase",
    "TrainingOrder",
    "TrainingOrderSpec",
    "case_window",
    "check_window",
    "flat_integers",
    "order_plan",
    "write_megatron",
]

ORDER_CASES = ("seen", "unseen", "recent", "step")
"""The cases of a suite whose training order is known, each a window of ``steps`` training steps:
``seen``, the steps up to the earliest analysed checkpoint (trained on by every one); ``unseen``,
those right after the latest (trained on by none); ``recent``, those up to each checkpoint's own
step (what it was last trained on); ``step``, the steps right after each checkpoint, up to the
next analysed one: the batches the step to it trained on (all of them when it is no longer)."""

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
"""The integer token dtypes of an ``.idx`` by code (codes 6 and 7, floats, hold no tokens)."""
_SHARD = re.compile(r"-(\d+)-of-(\d+)\.bin$")


@dataclass(frozen=True, kw_only=True)
class TrainingOrderSpec:
    """An analysis's ``training_order``: where the sequences are and how training read them."""

    path: str | list[str]
    """megatron: the prefix of PREFIX.idx + PREFIX.bin (or its shards); token_array: a file, a
    folder of files (read in name order), or a list of files in the order training numbered their
    instances (OLMo's ``data.paths``)."""
    format: Literal["megatron", "token_array"] = "megatron"
    sequences_per_step: Positive
    """Sequences in one optimizer step's batch (Pythia: 1,024)."""
    sequence_tokens: Positive | None = None
    """Tokens of one sequence (inputs and the target shifted by one: Pythia's 2,049); megatron: read
    from the index when not given (every sequence must have it)."""
    order: str | None = None
    """token_array: a file of instance indices in the order trained (OLMo's global indices)."""
    dtype: str = "uint16"
    """token_array: the dtype of raw token files (OLMo writes its ``part-*.npy`` raw, without a NumPy
    header: uint16, or uint32 for vocabularies above 65,536); an .npy with a header carries its own."""
    order_dtype: str = "uint32"
    """token_array: the dtype of a raw index file (OLMo writes ``global_indices.npy`` raw, uint32);
    an .npy with a header carries its own."""


@dataclass(frozen=True)
class OrderCase:
    """One job's case of a training order: the order, the window of steps (first, last) and the
    sequences of a batch (None: a training step's)."""

    spec: TrainingOrderSpec
    window: tuple[int, int]
    batch_sequences: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OrderCase:
        """From the plain data a workflow job is given (:meth:`to_dict`)."""
        spec = build(TrainingOrderSpec, dict(data["spec"]), "training_order.")
        return cls(spec, (int(data["window"][0]), int(data["window"][1])), data.get("batch_sequences"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": dataclasses.asdict(self.spec),
            "window": list(self.window),
            "batch_sequences": self.batch_sequences,
        }


class TrainingOrder:
    """The sequences of a published training order, memory-mapped.

    Raises (constructing):
        ValueError: a missing file, an index of another version or dtype, a truncated data file,
            sequences of another length, naming the file.
    """

    def __init__(self, spec: TrainingOrderSpec, vocab_size: int):
        self.spec, self.vocab_size = spec, vocab_size
        if spec.format == "megatron":
            if not isinstance(spec.path, str):
                raise ValueError("training_order.path: a megatron dataset is one prefix (PREFIX.idx + PREFIX.bin)")
            self._megatron(Path(spec.path))
        elif spec.format == "token_array":
            self._token_array(spec.path)
        else:
            raise ValueError(f"training_order.format: expected megatron or token_array, got {spec.format!r}")
        self._order = None
        if spec.order is not None:
            self._order = flat_integers(Path(spec.order), spec.order_dtype, "training_order.order_dtype")

    # --- reading the formats -------------------------------------------------------------------

    def _megatron(self, prefix: Path) -> None:
        idx = prefix.with_name(prefix.name + ".idx")
        if not idx.exists():
            raise ValueError(
                f"training_order.path: {idx} does not exist (a megatron dataset is PREFIX.idx + PREFIX.bin)"
            )
        with open(idx, "rb") as handle:
            header = handle.read(9 + 8 + 1 + 8 + 8)
        if len(header) < 34 or header[:9] != MEGATRON_MAGIC:
            raise ValueError(f"{idx}: not a Megatron/GPT-NeoX index (no MMIDIDX header)")
        version, code, count, documents = struct.unpack("<QBQQ", header[9:])
        if version != 1:
            raise ValueError(f"{idx}: index version {version}; only version 1 is read")
        if code not in MEGATRON_DTYPES:
            raise ValueError(f"{idx}: token dtype code {code} is not an integer dtype ({sorted(MEGATRON_DTYPES)})")
        dtype = np.dtype(MEGATRON_DTYPES[code])
        expected = 34 + count * 4 + count * 8 + documents * 8
        if idx.stat().st_size < expected:
            raise ValueError(f"{idx} is truncated: {idx.stat().st_size} bytes, its header says {expected}")
        sizes = np.memmap(idx, dtype=np.int32, mode="r", offset=34, shape=(count,))
        pointers = np.memmap(idx, dtype=np.int64, mode="r", offset=34 + count * 4, shape=(count,))
        length = self.spec.sequence_tokens or (int(sizes[0]) if count else 0)
        wrong = np.flatnonzero(np.asarray(sizes) != length)
        if len(wrong):
            raise ValueError(
                f"{idx}: sequence {int(wrong[0])} has {int(sizes[wrong[0]])} tokens, not {length}; a training "
                "order is fixed-length sequences (set sequence_tokens, or use the dataset training read)"
            )
        self._files = _megatron_files(prefix)
        self._dtype, self.sequence_tokens, self.sequences, self._pointers = dtype, length, count, pointers
        self._maps = [np.memmap(f, dtype=dtype, mode="r") for f in self._files]
        self._offsets = np.cumsum([0] + [len(m) for m in self._maps])
        needed = int(pointers[-1]) // dtype.itemsize + length if count else 0
        if self._offsets[-1] < needed:
            raise ValueError(
                f"{self._files[-1]}: the data holds {int(self._offsets[-1])} tokens, its index {needed} "
                "(truncated; download it again)"
            )

    def _token_array(self, path: str | list[str]) -> None:
        if self.spec.sequence_tokens is None:
            raise ValueError("training_order.sequence_tokens: a token_array order needs the length of its sequences")
        if isinstance(path, list):
            files = [Path(p) for p in path]
        else:
            folder = Path(path)
            files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else [folder]
        if not files:
            raise ValueError(f"training_order.path: {path} holds no token files")
        self._maps = [flat_integers(f, self.spec.dtype, "training_order.dtype") for f in files]
        # instances never cross a file: each file holds whole instances (a remainder is dropped)
        per_file = [len(m) // self.spec.sequence_tokens for m in self._maps]
        self._files, self._dtype, self.sequence_tokens = files, self._maps[0].dtype, self.spec.sequence_tokens
        self._instances = np.cumsum([0, *per_file])
        self.sequences = int(self._instances[-1])

    # --- the sequences -------------------------------------------------------------------------

    def instance(self, position: int) -> int:
        """The stored instance trained at ``position`` (the global order's, else the same).

        Raises:
            ValueError: a position beyond the index, or an index naming an instance beyond the data.
        """
        if self._order is None:
            return position
        if position >= len(self._order):
            raise ValueError(f"{self.spec.order}: position {position} beyond its {len(self._order)} indices")
        index = int(self._order[position])
        if not 0 <= index < self.sequences:
            raise ValueError(
                f"{self.spec.order}: position {position} names instance {index}, beyond the {self.sequences} "
                "instances of the token files (another data set's index, or the files in another order: list "
                "them as training numbered them)"
            )
        return index

    def check_positions(self, positions: range) -> None:
        """Every position of a window names an instance of the data, and no instance twice (a global
        index of another data set, or one that is not an order of instances, is refused before any work).

        Raises:
            ValueError: as :meth:`instance`; an instance named at two positions of the window, naming both.
        """
        if self._order is not None and len(positions):
            window = np.asarray(self._order[positions.start : positions.stop])
            if window.size and (int(window.max()) >= self.sequences or int(window.min()) < 0):
                bad = int(np.flatnonzero((window >= self.sequences) | (window < 0))[0]) + positions.start
                self.instance(bad)
            values, first, counts = np.unique(window, return_index=True, return_counts=True)
            if (counts > 1).any():
                twice = int(np.flatnonzero(counts > 1)[0])
                again = int(np.flatnonzero(window == values[twice])[1])
                raise ValueError(
                    f"{self.spec.order}: positions {positions.start + int(first[twice])} and {positions.start + again} "
                    f"both name instance {int(values[twice])}: a global index trains each instance once an epoch; "
                    "this file is not the run's order (give its global_indices file)"
                )

    def sequence(self, position: int) -> np.ndarray:
        """The tokens (int64) of the sequence trained at ``position``, its ids checked against the
        model's vocabulary."""
        if not 0 <= position < self.length:
            raise ValueError(f"training order: sequence {position} is beyond the data ({self.length} sequences)")
        i, T = self.instance(position), self.sequence_tokens
        if self.spec.format == "megatron":
            tokens = self._read(int(self._pointers[i]) // self._dtype.itemsize, T)
        else:
            f = int(np.searchsorted(self._instances, i, side="right") - 1)
            local = (i - int(self._instances[f])) * T
            tokens = np.asarray(self._maps[f][local : local + T], dtype=np.int64)
        if tokens.size and (int(tokens.max()) >= self.vocab_size or int(tokens.min()) < 0):
            raise ValueError(
                f"training order: sequence {position} holds token id {int(tokens.max())} beyond the model's "
                f"vocabulary ({self.vocab_size}); this is not the order the model was trained on"
            )
        return tokens

    def tokens(self, positions: np.ndarray | list[int]) -> Any:
        """The sequences trained at ``positions`` as a (len, sequence_tokens) int64 tensor (the
        token cache's interface: a batch's rows)."""
        import torch

        return torch.from_numpy(np.stack([self.sequence(int(i)) for i in positions]))

    def position(self, position: int) -> tuple[int]:
        """Where a sequence lies, for a result's per-sample records: its position in training."""
        return (int(position),)

    def _read(self, start: int, count: int) -> np.ndarray:
        """``count`` tokens from global token ``start`` across the data files (shards)."""
        parts, position, end = [], start, start + count
        while position < end:
            f = int(np.searchsorted(self._offsets, position, side="right") - 1)
            stop = min(end, int(self._offsets[f + 1]))
            parts.append(np.asarray(self._maps[f][position - self._offsets[f] : stop - self._offsets[f]]))
            position = stop
        return np.concatenate(parts).astype(np.int64)

    def check_sequence_length(self, seq_len: int) -> None:
        """A run reading ``seq_len`` targets reads sequences of ``seq_len + 1`` tokens.

        Raises:
            ValueError: the order's sequences are of another length, saying which seq_len fits.
        """
        if self.sequence_tokens != seq_len + 1:
            raise ValueError(
                f"its sequences hold {self.sequence_tokens} tokens, but data.seq_len {seq_len} reads {seq_len + 1} "
                f"(inputs and the shifted target); set data.seq_len: {self.sequence_tokens - 1}"
            )

    @property
    def length(self) -> int:
        """How many sequences can be read in training order."""
        return min(self.sequences, len(self._order)) if self._order is not None else self.sequences

    def step_sequences(self, first_step: int, steps: int) -> range:
        """The positions of the sequences of steps ``[first_step, first_step + steps)`` (step s
        trained sequences ``[(s − 1)·B, s·B)``, B = sequences_per_step).

        Raises:
            ValueError: a window before step 1 or beyond the data, naming it.
        """
        B = self.spec.sequences_per_step
        start, stop = (first_step - 1) * B, (first_step - 1 + steps) * B
        if first_step < 1 or steps < 1 or stop > self.length:
            raise ValueError(
                f"training order: steps {first_step}..{first_step + steps - 1} need sequences {start}..{stop - 1}, "
                f"but the data holds {self.length} ({self.length // B} steps of {B})"
            )
        return range(start, stop)

    def describe(self) -> dict[str, Any]:
        """What a result records of the order it read."""
        return {
            "format": self.spec.format,
            "files": [str(f) for f in self._files],
            "sequences": self.length,
            "sequence_tokens": self.sequence_tokens,
            "sequences_per_step": self.spec.sequences_per_step,
            "order": self.spec.order,
            "dtype": str(self._dtype),
            **({"order_dtype": str(self._order.dtype)} if self._order is not None else {}),
        }


def flat_integers(path: Path, dtype: str, key: str) -> np.ndarray:
    """A flat file of integers, memory-mapped: an .npy with a NumPy header carries its own dtype;
    any other file (OLMo's ``.npy`` files too, written by ``np.memmap`` without a header) is raw
    values of ``dtype`` (``key``: the setting that states it).

    Raises:
        ValueError: naming the file: missing, not a whole number of values, not integers.
    """
    if not path.is_file():
        raise ValueError(f"training_order: {path} does not exist")
    with open(path, "rb") as handle:
        headed = handle.read(6) == b"\x93NUMPY"
    if headed:
        try:
            array = np.load(path, mmap_mode="r").reshape(-1)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    else:
        try:
            raw = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"{key}: {dtype!r} is not a NumPy dtype (uint16, uint32, ...)") from None
        size = path.stat().st_size
        if size % raw.itemsize:
            raise ValueError(
                f"{path}: {size} bytes are not a whole number of {raw} values ({raw.itemsize} bytes each); set "
                f"{key} to the dtype it was written with, or download it again (truncated)"
            )
        array = np.memmap(path, dtype=raw, mode="r") if size else np.zeros(0, raw)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{path}: values of dtype {array.dtype}, not integers ({key})")
    return array


def _megatron_files(prefix: Path) -> list[Path]:
    """PREFIX.bin, else Pythia's shards PREFIX-000NN-of-000MM.bin (all of them, in order)."""
    single = prefix.with_name(prefix.name + ".bin")
    if single.exists():
        return [single]
    shards = sorted(prefix.parent.glob(f"{prefix.name}-*-of-*.bin"))
    numbered = [(int(m.group(1)), int(m.group(2)), s) for s in shards if (m := _SHARD.search(s.name))]
    if not numbered:
        raise ValueError(f"training_order.path: neither {single} nor its shards {prefix.name}-000NN-of-000MM.bin exist")
    total = numbered[0][1]
    if [n for n, _, _ in numbered] != list(range(len(numbered))) or len(numbered) != total:
        have = ", ".join(s.name for _, _, s in numbered[:3])
        raise ValueError(f"{prefix}: shards {have}, ... are not all {total} of {total}; download the missing ones")
    return [s for _, _, s in numbered]


def write_megatron(prefix: str | Path, sequences: np.ndarray, dtype: Any = np.uint16) -> None:
    """Write ``sequences`` (n, T) as a Megatron/GPT-NeoX indexed dataset (one document per
    sequence), the format GPT-NeoX trains from (for tests and small studies)."""
    prefix = Path(prefix)
    data = np.ascontiguousarray(sequences, dtype=dtype)
    n, T = data.shape
    code = next(c for c, d in MEGATRON_DTYPES.items() if np.dtype(d) == np.dtype(dtype))
    data.tofile(prefix.with_name(prefix.name + ".bin"))
    with open(prefix.with_name(prefix.name + ".idx"), "wb") as handle:
        handle.write(MEGATRON_MAGIC + struct.pack("<QBQQ", 1, code, n, n + 1))
        handle.write(np.full(n, T, dtype=np.int32).tobytes())
        handle.write((np.arange(n, dtype=np.int64) * T * data.itemsize).tobytes())
        handle.write(np.arange(n + 1, dtype=np.int64).tobytes())


def case_window(
    case: str, step: int, analysed: tuple[int, int], steps: int, next_step: int | None = None
) -> tuple[int, int]:
    """(first step, last step) of ``case``'s window of ``steps`` training steps for a checkpoint at
    ``step`` of an analysis whose checkpoints lie at steps ``analysed`` = (earliest, latest);
    ``next_step``: the next analysed checkpoint's step (``step``: the window ends there, or is
    shorter; None for the last checkpoint).

    Raises:
        ValueError: a window a checkpoint has not reached (seen, recent: before step 1), naming it.
    """
    earliest, latest = analysed
    if case == "step":
        return step + 1, step + (steps if next_step is None else min(steps, next_step - step))
    end = {"seen": earliest, "recent": step, "unseen": latest + steps}[case]
    if end - steps + 1 < 1:
        whose = "the earliest analysed checkpoint" if case == "seen" else "this checkpoint"
        shorter = f" or case_steps: {end}" if end >= 1 else ""
        raise ValueError(
            f"case {case}: {whose} (step {end}) has trained {end} steps, fewer than the window's {steps} "
            f"(case_steps); leave out the checkpoints before step {steps} (revisions: {{min_step: {steps}}}){shorter}"
        )
    return end - steps + 1, end


def check_window(case: str, window: tuple[int, int], step: int) -> None:
    """A checkpoint at ``step`` must have trained on every step of a ``seen`` or ``recent``
    window, and on none of an ``unseen`` one.

    Raises:
        ValueError: naming the case, the window and the checkpoint's step.
    """
    first, last = window
    if case in ("seen", "recent") and last > step:
        raise ValueError(
            f"case {case}: window steps {first}..{last} reach past this checkpoint (step {step}), which has not "
            "trained on them"
        )
    if case in ("unseen", "step") and first <= step:
        raise ValueError(
            f"case {case}: window steps {first}..{last} start at or before this checkpoint's step {step}; it has "
            "trained on them"
        )


def order_plan(order: TrainingOrder, window: tuple[int, int], batch_sequences: int | None = None) -> BatchPlan:
    """The batch plan of a training-order case: the window's sequences in training order, in
    batches of ``batch_sequences`` (a training step's batch by default, or a divisor of it); a
    batch's ``stream_batches`` entry is the step that trained it.

    Raises:
        ValueError: a batch that does not divide the step's, or a window beyond the data.
    """
    B = order.spec.sequences_per_step
    b = batch_sequences or B
    if B % b:
        raise ValueError(f"batch_sequences: expected a divisor of sequences_per_step ({B}), got {b}")
    first, last = window
    positions = np.asarray(order.step_sequences(first, last - first + 1), dtype=np.int64)
    return BatchPlan(
        f"steps {first}..{last} in batches of {b}",
        positions.reshape(-1, b),
        first + np.arange(len(positions) // b) * b // B,
    )
