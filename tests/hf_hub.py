"""A miniature of the Hugging Face hub's local cache (no download): a repository's revisions laid
out as ``hf download`` leaves them (``models--ORG--NAME/blobs``, ``snapshots/<commit>/`` linking to
the blobs, ``refs/<revision>`` naming the commit), so that huggingface_hub resolves them offline."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def cache_revision(cache: Path, repo: str, revision: str, folder: Path) -> Path:
    """Put ``folder``'s files into ``cache`` as ``repo`` at ``revision``; returns the snapshot folder."""
    root = cache / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in sorted(folder.iterdir()):
        blob = root / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        if not blob.exists():
            shutil.copyfile(file, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    (root / "refs" / revision).write_text(commit)
    return snapshot


def neox_config(**changes):
    """A tiny GPT-NeoX configuration (Pythia's architecture: partial rotary, untied head)."""
    import transformers

    shape = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    return transformers.GPTNeoXConfig(
        **{**shape, "max_position_embeddings": 16, "rotary_pct": 0.25, "tie_word_embeddings": False, **changes}
    )


RUN_YAML = (
    "data: {cache: cache/p, seq_len: 8, shuffle_group_blocks: 4}\n"
    "training: {batch_size: 2, micro_batch_size: 2, tokens: 32, epochs: 1}\n"
)
"""A run configuration for the tiny suites: sequences of 8 (+1) tokens, batches of 2."""


def neox_suite(tmp: Path, steps: tuple[int, ...], seed: int = 0) -> dict[int, Path]:
    """Tiny GPT-NeoX checkpoints (Pythia's architecture), one folder per step, saved as
    transformers saves them: θ₀ + step·δ for a seeded δ, so that ‖θ − θ₀‖ grows with the step as
    along a training run."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.GPTNeoXForCausalLM(neox_config()).eval()
    parameters = dict(model.named_parameters())
    start = {k: p.detach().clone() for k, p in parameters.items()}
    drift = {k: 1e-3 * torch.randn_like(v) for k, v in start.items()}
    folders = {}
    for step in steps:
        with torch.no_grad():
            for k, p in parameters.items():
                p.copy_(start[k] + step * drift[k])
        folders[step] = tmp / f"seed{seed}-step{step}"
        model.save_pretrained(folders[step], safe_serialization=True)
    return folders


def as_bin(folder: Path, dtype=None) -> None:
    """Replace a folder's model.safetensors by pytorch_model.bin (``dtype``: stored in it), as many
    intermediate Pythia revisions are published."""
    import torch
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    torch.save({k: v.to(dtype) if dtype else v for k, v in state.items()}, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
