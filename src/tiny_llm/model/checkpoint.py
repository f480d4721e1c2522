"""Checkpoint files: safetensors weights with metadata, ``.pt`` training states, strict validation.

Checkpoints are data, not code: ``.pt`` files are read with ``torch.load(weights_only=True)``,
so a file holding arbitrary pickled objects is refused rather than executed.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import types
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save
from torch import nn

from tiny_llm.io import atomic_path
from tiny_llm.model.pickles import load_pickle

__all__ = [
    "check_state_dict",
    "load_model_weights",
    "load_train_state",
    "load_weights",
    "save_train_state",
    "save_weights",
    "state_hash",
]

TRAIN_STATE_KIND = "tiny_llm.train_state"


def save_weights(path: str | Path, state: dict[str, torch.Tensor], metadata: dict[str, Any]) -> None:
    """Write weights as safetensors atomically; metadata values are stored as strings.

    Equal weights and metadata give equal bytes: the JSON header (whose key order safetensors
    leaves to a hash map) is written with sorted keys, padded to 8 bytes as the format asks.
    """
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    raw = save(tensors, metadata={k: str(v) for k, v in metadata.items()})
    size = int.from_bytes(raw[:8], "little")
    header = json.dumps(json.loads(raw[8 : 8 + size]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with atomic_path(path) as tmp:
        tmp.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + size :])


class _CanonicalPickler(pickle.Pickler):
    """A pickler without a memo: the bytes depend on the values only, not on which objects happen to
    be shared (a resumed process shares differently from an uninterrupted one)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fast = True


_CANONICAL_PICKLE = types.ModuleType("tiny_llm_canonical_pickle")
_CANONICAL_PICKLE.Pickler = _CanonicalPickler


def save_train_state(path: str | Path, state: dict[str, Any]) -> None:
    """Write a training state (tensors and plain data only) with torch.save, atomically.

    Equal states give equal bytes: saved through a file handle (the archive's inner names do not
    depend on the temporary file's name) and pickled without a memo.
    """
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        torch.save({"kind": TRAIN_STATE_KIND, **state}, handle, pickle_module=_CANONICAL_PICKLE)


def load_train_state(path: str | Path) -> dict[str, Any]:
    """Read a ``.pt`` training state safely (``weights_only=True``).

    Raises:
        ValueError: missing, truncated or corrupt file, pickled objects other than plain tensors
            and containers, or a file that is not a tiny-llm training state.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"checkpoint {path} does not exist")
    state = load_pickle(path)
    if not isinstance(state, dict) or state.get("kind") != TRAIN_STATE_KIND:
        raise ValueError(
            f"checkpoint {path} is not a tiny-llm training state (expected a dict with kind={TRAIN_STATE_KIND!r})"
        )
    return state


def load_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Root weights and metadata from ``epoch-NNN.safetensors`` or ``final.pt``.

    Raises:
        ValueError: unreadable, truncated or corrupt file, or an unsupported extension.
    """
    path = Path(path)
    if path.suffix == ".pt":
        state = load_train_state(path)
        return state["model"], {k: str(v) for k, v in state["position"].items()}
    if path.suffix != ".safetensors":
        raise ValueError(f"checkpoint {path}: expected a .safetensors or .pt file")
    if not path.exists():
        raise ValueError(f"checkpoint {path} does not exist")
    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
        return load_file(path), metadata
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(
            f"checkpoint {path} is truncated or corrupt ({error}); re-export it or use another checkpoint"
        ) from None


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Strict check before loading: same names, same shapes, floating and finite values.

    Raises:
        ValueError: naming every missing, unexpected, mis-shaped or non-finite tensor.
    """
    expected = model.state_dict()
    problems = []
    if missing := sorted(set(expected) - set(state)):
        problems.append(f"missing tensors {missing}")
    if unexpected := sorted(set(state) - set(expected)):
        problems.append(f"unexpected tensors {unexpected}")
    for name in sorted(set(expected) & set(state)):
        want, got = expected[name], state[name]
        if tuple(got.shape) != tuple(want.shape):
            problems.append(f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        elif not got.is_floating_point():
            problems.append(f"{name}: dtype {got.dtype}, expected a floating dtype")
        elif not torch.isfinite(got).all():
            problems.append(f"{name}: {int((~torch.isfinite(got)).sum())} non-finite values (NaN/inf)")
    if problems:
        raise ValueError(f"{source} does not match the model: " + "; ".join(problems))


def load_model_weights(model: nn.Module, path: str | Path) -> dict[str, str]:
    """Strictly load a checkpoint's root weights into ``model``; returns the file's metadata."""
    state, metadata = load_weights(path)
    check_state_dict(model, state, source=str(path))
    model.load_state_dict(state, strict=True)
    return metadata


def state_hash(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a parameter state: names, shapes, dtypes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()
