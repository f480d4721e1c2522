"""A published training order read in place: GPT-NeoX/Megatron indexed datasets (whole or in
Pythia's shards) and flat token arrays with a global index order, each sequence at the step that
trained it; every defect refused by name."""

import struct

import numpy as np
import pytest

from tiny_llm.data.training_order import TrainingOrder, TrainingOrderSpec, write_megatron

N, T, B, VOCAB = 12, 9, 4, 50
"""12 sequences of 9 tokens, 4 per step: steps 1..3."""


@pytest.fixture
def sequences():
    return np.random.default_rng(0).integers(0, VOCAB, size=(N, T)).astype(np.uint16)


def _index(path, code, n, T, itemsize, version=1):
    """An .idx written field by field, as GPT-NeoX's _IndexWriter lays it out (independent of the
    project's writer)."""
    with open(path, "wb") as handle:
        handle.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", version) + struct.pack("<B", code))
        handle.write(struct.pack("<Q", n) + struct.pack("<Q", n + 1))
        handle.write(struct.pack(f"<{n}i", *([T] * n)))
        handle.write(struct.pack(f"<{n}q", *(i * T * itemsize for i in range(n))))
        handle.write(struct.pack(f"<{n + 1}q", *range(n + 1)))


def _order(prefix, **spec):
    return TrainingOrder(TrainingOrderSpec(path=str(prefix), sequences_per_step=B, **spec), VOCAB)


def test_a_megatron_dataset_gives_each_step_its_sequences(tmp_path, sequences):
    _index(tmp_path / "document.idx", 8, N, T, 2)
    sequences.tofile(tmp_path / "document.bin")
    order = _order(tmp_path / "document")
    assert order.sequences == N and order.sequence_tokens == T
    for i in range(N):
        assert np.array_equal(order.sequence(i), sequences[i])
    assert order.step_sequences(2, 1) == range(4, 8)  # step 2 trained sequences 4..7: i // B + 1 == 2
    order.check_sequence_length(T - 1)  # a run of seq_len 8 reads 9 tokens a sequence
    with pytest.raises(ValueError, match="hold 9 tokens, but data.seq_len 7 reads 8 .* set data.seq_len: 8"):
        order.check_sequence_length(T - 2)
    assert all(i // B + 1 in (2, 3) for i in order.step_sequences(2, 2))
    write_megatron(tmp_path / "ours", sequences)  # the project's writer gives the same files
    assert (tmp_path / "ours.idx").read_bytes() == (tmp_path / "document.idx").read_bytes()


def test_pythias_shards_are_read_as_one_file(tmp_path, sequences):
    write_megatron(tmp_path / "document", sequences)
    data = (tmp_path / "document.bin").read_bytes()
    (tmp_path / "document.bin").unlink()
    cuts = [0, 50, 130, len(data)]  # shard boundaries inside sequences
    for k in range(3):
        (tmp_path / f"document-{k:05d}-of-00003.bin").write_bytes(data[cuts[k] : cuts[k + 1]])
    order = _order(tmp_path / "document")
    assert all(np.array_equal(order.sequence(i), sequences[i]) for i in range(N))
    (tmp_path / "document-00001-of-00003.bin").unlink()
    with pytest.raises(ValueError, match="are not all 3 of 3; download the missing ones"):
        _order(tmp_path / "document")


def test_flat_token_arrays_in_their_global_order(tmp_path, sequences):
    folder = tmp_path / "olmo"
    folder.mkdir()
    np.save(folder / "part-0.npy", sequences[:5].reshape(-1))
    np.save(folder / "part-1.npy", sequences[5:].reshape(-1))
    permutation = np.random.default_rng(1).permutation(N)
    np.save(tmp_path / "order.npy", permutation)
    plain = _order(folder, format="token_array", sequence_tokens=T)
    assert all(np.array_equal(plain.sequence(i), sequences[i]) for i in range(N))
    ordered = _order(folder, format="token_array", sequence_tokens=T, order=str(tmp_path / "order.npy"))
    assert all(np.array_equal(ordered.sequence(i), sequences[permutation[i]]) for i in range(N))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated", r"document.bin: the data holds 100 tokens, its index 108 \(truncated"),
        ("version", "index version 2; only version 1 is read"),
        ("float", "token dtype code 7 is not an integer dtype"),
        ("length", "sequence 0 has 9 tokens, not 8"),
        ("not_an_index", "not a Megatron/GPT-NeoX index"),
        ("missing", r"document.idx does not exist"),
    ],
)
def test_a_damaged_dataset_is_refused_by_name(tmp_path, sequences, damage, message):
    _index(tmp_path / "document.idx", 8, N, T, 2, version=2 if damage == "version" else 1)
    sequences.tofile(tmp_path / "document.bin")
    spec = {}
    if damage == "truncated":
        (tmp_path / "document.bin").write_bytes((tmp_path / "document.bin").read_bytes()[:200])
    elif damage == "float":
        _index(tmp_path / "document.idx", 7, N, T, 2)
    elif damage == "length":
        spec = {"sequence_tokens": 8}
    elif damage == "not_an_index":
        (tmp_path / "document.idx").write_bytes(b"x" * 64)
    elif damage == "missing":
        (tmp_path / "document.idx").unlink()
    with pytest.raises(ValueError, match=message):
        _order(tmp_path / "document", **spec)


def test_ids_beyond_the_vocabulary_and_windows_beyond_the_data_are_refused(tmp_path, sequences):
    bad = sequences.copy()
    bad[5, 3] = VOCAB
    write_megatron(tmp_path / "document", bad)
    order = _order(tmp_path / "document")
    assert np.array_equal(order.sequence(4), sequences[4])
    with pytest.raises(ValueError, match=r"sequence 5 holds token id 50 beyond the model's vocabulary \(50\)"):
        order.sequence(5)
    with pytest.raises(ValueError, match=r"steps 3..4 need sequences 8..15, but the data holds 12 \(3 steps of 4\)"):
        order.step_sequences(3, 2)
    with pytest.raises(ValueError, match="sequence 12 is beyond the data"):
        order.sequence(12)


def _olmo_memmap(path, values, dtype):
    """A file as OLMo writes its token files and global index: ``np.memmap(..., mode="w+")``,
    raw values with no NumPy header, whatever the name's suffix."""
    array = np.memmap(path, dtype=dtype, mode="w+", shape=values.shape)
    array[:] = values
    array.flush()


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_olmos_files_are_read_as_olmo_writes_them(tmp_path, sequences, dtype):
    """Raw part-*.npy token files of a stated dtype, listed in the order of OLMo's data.paths (not
    their names' order), through a raw uint32 global_indices.npy."""
    _olmo_memmap(tmp_path / "part-1-00000.npy", sequences[:5].reshape(-1), dtype)
    _olmo_memmap(tmp_path / "part-0-00000.npy", sequences[5:].reshape(-1), dtype)  # second in data.paths
    permutation = np.random.default_rng(1).permutation(N).astype(np.uint32)
    _olmo_memmap(tmp_path / "global_indices.npy", permutation, np.uint32)
    paths = [str(tmp_path / "part-1-00000.npy"), str(tmp_path / "part-0-00000.npy")]
    spec = {"format": "token_array", "sequence_tokens": T, "dtype": np.dtype(dtype).name}
    order = _order(paths[0], **spec)  # one file: its own instances
    assert order.sequences == 5 and np.array_equal(order.sequence(4), sequences[4])
    order = TrainingOrder(
        TrainingOrderSpec(path=paths, sequences_per_step=B, order=str(tmp_path / "global_indices.npy"), **spec), VOCAB
    )
    assert all(np.array_equal(order.sequence(i), sequences[permutation[i]]) for i in range(N))
    assert order.describe()["dtype"] == np.dtype(dtype).name and order.describe()["order_dtype"] == "uint32"
    order.check_positions(order.step_sequences(1, 3))


def test_olmo_files_of_another_dtype_length_or_data_set_are_refused_by_name(tmp_path, sequences):
    _olmo_memmap(tmp_path / "part-0.npy", sequences.reshape(-1), np.uint16)
    spec = {"format": "token_array", "sequence_tokens": T}
    (tmp_path / "odd.npy").write_bytes(b"\x01\x02\x03")
    with pytest.raises(
        ValueError, match=r"odd.npy: 3 bytes are not a whole number of uint16 values .* training_order.dtype"
    ):
        _order(tmp_path / "odd.npy", **spec)
    with pytest.raises(ValueError, match=r"training_order.dtype: 'uint12' is not a NumPy dtype"):
        _order(tmp_path / "part-0.npy", **spec, dtype="uint12")
    with pytest.raises(ValueError, match=r"training_order: .*missing.npy does not exist"):
        TrainingOrder(TrainingOrderSpec(path=[str(tmp_path / "missing.npy")], sequences_per_step=B, **spec), VOCAB)
    np.save(tmp_path / "floats.npy", np.zeros(4))
    with pytest.raises(ValueError, match=r"floats.npy: values of dtype float64, not integers"):
        _order(tmp_path / "part-0.npy", **spec, order=str(tmp_path / "floats.npy"))
    _olmo_memmap(tmp_path / "other.npy", np.arange(N, dtype=np.uint32) + 7, np.uint32)  # another data set's
    order = _order(tmp_path / "part-0.npy", **spec, order=str(tmp_path / "other.npy"))
    with pytest.raises(ValueError, match=r"other.npy: position 5 names instance 12, beyond the 12 instances"):
        order.check_positions(order.step_sequences(1, 3))
    _olmo_memmap(tmp_path / "repeated.npy", np.arange(N, dtype=np.uint32) % 5, np.uint32)  # not an order
    order = _order(tmp_path / "part-0.npy", **spec, order=str(tmp_path / "repeated.npy"))
    order.check_positions(order.step_sequences(1, 1))  # 4 distinct instances
    with pytest.raises(ValueError, match=r"repeated.npy: positions 0 and 5 both name instance 0: a global index"):
        order.check_positions(order.step_sequences(1, 2))
    with pytest.raises(ValueError, match="a megatron dataset is one prefix"):
        TrainingOrder(TrainingOrderSpec(path=["a", "b"], sequences_per_step=B), VOCAB)
