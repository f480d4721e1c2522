"""The optimizer's preconditioner at a state, found and checked before any compute: Adam's
P = diag(1 / (√v̂ + ε)) from the moments kept beside the checkpoint (``moments-NNN.safetensors``,
training here with ``keep_moments``, or a Trainer checkpoint's optimizer.pt imported) or held in a
training state (``final.pt``); P = I for a run trained here with SGD (its update is −η times the
momentum buffer: the plain geometry is its own). Where a state has none (the initialisation, whose
Adam state has no second moment yet; a packed run, whose workers each keep their own; a suite that
published weights only), the preconditioned statistics are blank with the reason recorded, or
refused by name with ``preconditioned: true``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tiny_llm.config import RunConfig
from tiny_llm.layout import IMPORTED, TRAIN_LOG, moments_file
from tiny_llm.model.checkpoint import load_train_state
from tiny_llm.model.moments import AdamMoments, load_moments, moments_from_optimizer, named_shapes, preconditioner
from tiny_llm.workers.loading import LoadedState

__all__ = ["Preconditioning", "load_preconditioning"]

_IMPORTED_WITHOUT = (
    "was imported from checkpoints without an optimizer state (a hub suite such as Pythia or OLMo "
    "publishes its weights only); import Trainer checkpoints with their optimizer.pt to measure in "
    "Adam's geometry"
)


@dataclass(frozen=True)
class Preconditioning:
    """P's diagonal by parameter name (None: blank, ``record['reason']`` says why) and what a result
    records of it: the optimizer, its step, learning rate, β's, ε, decay and stability threshold."""

    diagonal: dict[str, torch.Tensor] | None
    record: dict[str, Any] = field(default_factory=dict)


def _logged_lr(run_dir: Path, step: int) -> float | None:
    """The learning rate training logged for step ``step`` (None where not logged)."""
    path = run_dir / TRAIN_LOG
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("step") == step and "lr" in record:
            return float(record["lr"])
    return None


def _sgd(run_dir: Path, config: RunConfig, step: int, shapes: dict[str, tuple[int, ...]]) -> Preconditioning:
    """SGD's geometry: P = I; its threshold 2(1 + μ)/η for momentum μ (Cohen et al. 2021)."""
    lr, momentum = _logged_lr(run_dir, step), config.training.momentum
    record = {
        "optimizer": "sgd",
        "step": step,
        "lr": lr,
        "momentum": momentum,
        "stability_threshold": None if lr is None else 2 * (1 + momentum) / lr,
        "source": "P = I (SGD)",
    }
    return Preconditioning({n: torch.ones(s, dtype=torch.float64) for n, s in shapes.items()}, record)


def _moments(run_dir: Path, file: str) -> AdamMoments | str:
    """The Adam moments kept for checkpoint ``file``, or why there are none."""
    path = run_dir / file
    if path.suffix == ".pt":
        workers = load_train_state(path)["workers"]
        try:
            return moments_from_optimizer(workers[0]["optimizer"], None, file)
        except ValueError as error:
            return f"{error} (saved before training named its optimizer's groups)"
    name = moments_file(file)
    if name is None or not (run_dir / name).exists():
        return f"{file} has no {name or 'moments file'} beside it (train with training.keep_moments: true)"
    return load_moments(run_dir / name)


def _blank(reason: str, asked: bool | str, where: str) -> Preconditioning:
    if asked is True:
        raise ValueError(f"preconditioned: true, but {where}: {reason}; set preconditioned: auto or false")
    return Preconditioning(None, {"reason": reason})


def load_preconditioning(
    run_dir: str | Path, state: LoadedState, config: RunConfig, asked: bool | str
) -> Preconditioning | None:
    """The preconditioner of ``state`` for the ``preconditioned`` setting ``asked`` (None for false),
    checked against the parameters of the run's model (tied weights once).

    Raises:
        ValueError: with ``preconditioned: true``, a state without one, naming why and what would
            give it; a moments file that does not fit the model (always).
    """
    if asked is False:
        return None
    run_dir = Path(run_dir)
    where = f"{run_dir.name}/{state.aliases[0]['file']}"
    imported = (run_dir / IMPORTED).exists()
    if config.training.packed is not None:
        return _blank("a packed run's workers each keep their own optimizer state", asked, where)
    step = min(int(a["step"]) for a in state.aliases)
    if not imported and config.training.optimizer == "sgd":
        return _sgd(run_dir, config, step, named_shapes(config.model))
    if step == 0:
        return _blank("at step 0 Adam has no second moment yet, so there is no preconditioner", asked, where)
    reasons = []
    for alias in state.aliases:
        found = _moments(run_dir, alias["file"])
        if isinstance(found, AdamMoments):
            source = f"{run_dir.name}/{found.source}"
            found.check(named_shapes(config.model), source)
            if int(alias["step"]) >= 0 and found.step != int(alias["step"]):
                raise ValueError(
                    f"{source}: the optimizer state is at step {found.step}, the checkpoint {alias['file']} at step "
                    f"{alias['step']}; it belongs to another checkpoint"
                )
            return Preconditioning(preconditioner(found), found.record())
        reasons.append(found)
    return _blank(f"{run_dir.name} {_IMPORTED_WITHOUT}" if imported else reasons[0], asked, where)
