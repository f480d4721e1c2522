"""Checkpoints: strict validation, refusal of corrupt files and pickled code, hashing."""

from pathlib import Path

import pytest
import torch

from tiny_llm.model.checkpoint import (
    check_state_dict,
    load_model_weights,
    load_train_state,
    load_weights,
    save_train_state,
    save_weights,
    state_hash,
)
from tiny_llm.model.llama import Llama


class _Payload:
    """Unpickling this would create a file: proof that the loader never runs pickled code."""

    marker: Path = Path("/nonexistent")

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_weights_round_trip_with_metadata(tmp_path, tiny_model_config):
    model = Llama(tiny_model_config)
    save_weights(tmp_path / "w.safetensors", model.state_dict(), {"step": 3, "tokens": 96})
    state, meta = load_weights(tmp_path / "w.safetensors")
    assert meta["step"] == "3" and meta["tokens"] == "96"
    assert state_hash(state) == state_hash(model.state_dict())
    other = Llama(tiny_model_config)
    load_model_weights(other, tmp_path / "w.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True))


def test_truncated_safetensors_is_refused(tmp_path, tiny_model_config):
    path = tmp_path / "w.safetensors"
    save_weights(path, Llama(tiny_model_config).state_dict(), {})
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="is truncated or corrupt"):
        load_model_weights(Llama(tiny_model_config), path)


def test_pickled_object_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "executed"
    _Payload.marker = marker
    path = tmp_path / "final.pt"
    torch.save({"kind": "tiny_llm.train_state", "model": _Payload()}, path)
    with pytest.raises(ValueError, match="is a pickle that would run code when read"):
        load_train_state(path)
    assert not marker.exists()


def test_pt_must_be_a_training_state(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="is not a tiny-llm training state"):
        load_weights(tmp_path / "x.pt")
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(ValueError, match="is truncated or corrupt"):
        load_weights(tmp_path / "cut.pt")
    save_train_state(tmp_path / "ok.pt", {"model": {"a": torch.ones(1)}, "position": {"step": 1}})
    assert load_weights(tmp_path / "ok.pt")[1] == {"step": "1"}


def test_strict_check_names_every_problem(tiny_model_config):
    model = Llama(tiny_model_config)
    state = dict(model.state_dict())
    del state["norm.weight"]
    state["extra.weight"] = torch.zeros(1)
    state["tok_embeddings.weight"] = torch.zeros(3, 3)
    state["layers.0.attention.wq.weight"] = torch.full((8, 8), float("nan"))
    with pytest.raises(ValueError) as error:
        check_state_dict(model, state, source="epoch-001.safetensors")
    message = str(error.value)
    for part in (
        "epoch-001.safetensors does not match the model",
        "missing tensors ['norm.weight']",
        "unexpected tensors ['extra.weight']",
        "tok_embeddings.weight: shape (3, 3), expected (16, 8)",
        "layers.0.attention.wq.weight: 64 non-finite values",
    ):
        assert part in message


def test_state_hash_sees_every_bit():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    b = {"b": torch.tensor([0.5]), "w": torch.tensor([1.0, 2.0])}
    assert state_hash(a) == state_hash(b)
    assert state_hash(a) != state_hash(
        {**a, "w": torch.tensor([1.0, torch.nextafter(torch.tensor(2.0), torch.tensor(3.0))])}
    )
    assert state_hash(a) != state_hash({**a, "w": a["w"].double()})
    assert state_hash(a) != state_hash({"v": a["w"], "b": a["b"]})


def test_atomic_writes_leave_nothing_on_failure(tmp_path):
    with pytest.raises(TypeError):
        save_weights(tmp_path / "w.safetensors", {"x": torch.zeros(1)}, {"bad": object()} | {1: 2})
    assert list(tmp_path.iterdir()) == []
