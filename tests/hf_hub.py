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


def alias_revision(cache: Path, repo: str, revision: str, of: str) -> None:
    """Name ``of``'s commit ``revision`` too (as Pythia's ``main`` is its last ``stepN``)."""
    refs = cache / f"models--{repo.replace('/', '--')}" / "refs"
    (refs / revision).write_text((refs / of).read_text())


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


def ordered_suite(
    root: Path,
    per_step: int,
    steps: int,
    saved: tuple[int, ...],
    seed: int = 0,
    repo: str = "org/ordered",
    data: Path | None = None,
):
    """A suite trained on its own published order: ``steps`` × ``per_step`` sequences of 9 tokens
    written as a Megatron indexed dataset (``data``, default ``root/document``), a tiny GPT-NeoX
    trained by SGD on them in order (step s on sequences [(s − 1)·per_step, s·per_step)), its
    ``saved`` steps (0: the initialisation) in the cache ``root/hf`` as ``repo``'s revisions
    ``step<s>`` (and in ``root/saved-step<s>``), and ``main`` naming the last one's commit, as
    ``hf download`` leaves a suite. Returns the sequences."""
    import numpy as np
    import torch
    import transformers

    from tiny_llm.data.training_order import write_megatron

    sequences = np.random.default_rng(seed).integers(0, 64, size=(steps * per_step, 9)).astype(np.uint16)
    (data or root / "document").parent.mkdir(parents=True, exist_ok=True)
    write_megatron(data or root / "document", sequences)
    torch.manual_seed(seed)
    model = transformers.GPTNeoXForCausalLM(neox_config(num_hidden_layers=1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(max(saved) + 1):
        if step:
            batch = torch.from_numpy(sequences[(step - 1) * per_step : step * per_step].astype(np.int64))
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if step in saved:
            model.save_pretrained(root / f"saved-step{step}", safe_serialization=True)
            cache_revision(root / "hf", repo, f"step{step}", root / f"saved-step{step}")
    alias_revision(root / "hf", repo, "main", f"step{max(saved)}")
    return sequences
