"""An Adam optimizer's state as data: its moments by parameter name, the hyper-parameters it applied
at its last step, and the diagonal preconditioner P that step used.

torch's Adam and AdamW update a parameter at step t (counted from 1) by

    m_t = β1 m_{t−1} + (1 − β1) g,   v_t = β2 v_{t−1} + (1 − β2) g²,
    θ ← θ − η m_t / (1 − β1^t) / (√v_t / √(1 − β2^t) + ε)      (AdamW first θ ← (1 − η λ) θ)

so the update is −η P m̂_t with P = diag(1 / (√v̂_t + ε)), v̂_t = v_t / (1 − β2^t): bias correction
included, exactly as the optimizer applied it. AdamW's decoupled decay (−η λ θ) is not part of P and
is recorded beside it (``weight_decay`` per parameter). A state at step 0 has no second moment, so it
has no P (:func:`preconditioner` gives None, never P = I).

An optimizer's ``state_dict`` numbers its tensors by its parameter groups (for instance the decayed
tensors first, then the rest), not by the model's parameter order, and several tensors share a
shape; so moments are only ever mapped by name: from the names the groups carry (``param_names``,
which training here records) or from names a caller proves (a Trainer's grouping rule,
:mod:`tiny_llm.model.hf_optimizer`). A moments file (``moments-NNN.safetensors``, beside the
checkpoint it belongs to) holds ``exp_avg.<name>`` and ``exp_avg_sq.<name>`` for every parameter and
the hyper-parameters in its metadata. Checkpoints are data: ``.pt`` states are read with
``weights_only=True``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tiny_llm.model.checkpoint import load_weights, save_weights

__all__ = [
    "MOMENTS_FORMAT",
    "AdamMoments",
    "load_moments",
    "load_into",
    "moments_from_optimizer",
    "named_shapes",
    "next_preconditioner",
    "preconditioner",
    "save_moments",
    "stability_threshold",
]

MOMENTS_FORMAT = "tiny_llm.adam_moments/1"


def named_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """The trainable parameters of the model ``config`` (a ``ModelConfig``) describes, by name and
    shape, tied weights once: what its optimizer holds moments of (built on the meta device)."""
    from tiny_llm.architectures import build_model

    with torch.device("meta"):
        return {n: tuple(p.shape) for n, p in build_model(config).named_parameters()}


def stability_threshold(beta1: float, lr: float) -> float:
    """Adam's stability threshold (2 + 2β1) / ((1 − β1) η) for the preconditioned sharpness λ_max(PH)
    (Cohen et al. 2022, "Adaptive gradient methods at the edge of stability"): 38/η at β1 = 0.9."""
    return (2 + 2 * beta1) / ((1 - beta1) * lr)


@dataclass(frozen=True)
class AdamMoments:
    """An Adam(W) state after its step ``step``: m and v by parameter name, and what that step applied."""

    step: int
    lr: float | None
    """The learning rate the last step applied (the schedule's value at that step); None: unknown."""
    beta1: float
    beta2: float
    eps: float
    exp_avg: dict[str, torch.Tensor]
    exp_avg_sq: dict[str, torch.Tensor]
    weight_decay: dict[str, float]
    """AdamW's decoupled decay λ of each parameter's group (0 where not decayed)."""
    source: str = ""

    def record(self) -> dict[str, Any]:
        """What a result says of the preconditioner (plain data)."""
        return {
            "optimizer": "adamw",
            "step": self.step,
            "lr": self.lr,
            "beta1": self.beta1,
            "beta2": self.beta2,
            "eps": self.eps,
            "weight_decay": sorted(set(self.weight_decay.values())),
            "stability_threshold": None if not self.lr else stability_threshold(self.beta1, self.lr),
            "source": self.source,
        }

    def check(self, shapes: dict[str, tuple[int, ...]], source: str) -> None:
        """Every parameter's moments present, finite, v ≥ 0 and of its shape, and nothing else.

        Raises:
            ValueError: naming ``source`` and the first parameter that is missing, extra or wrong.
        """
        for kind, tensors in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
            missing, extra = sorted(set(shapes) - set(tensors)), sorted(set(tensors) - set(shapes))
            if missing or extra:
                raise ValueError(
                    f"{source}: the optimizer's {kind} does not name the model's parameters "
                    f"(missing {missing[:3]}, unexpected {extra[:3]}); it belongs to another model"
                )
            for name, shape in shapes.items():
                if tuple(tensors[name].shape) != tuple(shape):
                    raise ValueError(
                        f"{source}: {kind} of {name} has shape {tuple(tensors[name].shape)}, the parameter "
                        f"{tuple(shape)}; the optimizer state is mapped to the wrong parameters"
                    )
                if not bool(torch.isfinite(tensors[name]).all()):
                    raise ValueError(f"{source}: {kind} of {name} is not finite")
        if any(bool((v < 0).any()) for v in self.exp_avg_sq.values()):
            raise ValueError(f"{source}: a second moment is negative; the file is corrupt")
        if self.step < 0 or not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0 and (self.lr or 0) >= 0):
            raise ValueError(
                f"{source}: step {self.step}, lr {self.lr}, betas ({self.beta1}, {self.beta2}), eps {self.eps} "
                "are not an Adam state's"
            )


def preconditioner(moments: AdamMoments) -> dict[str, torch.Tensor] | None:
    """P's diagonal by parameter name, float64: 1 / (√(v_t / (1 − β2^t)) + ε), as torch's Adam(W)
    applied it at step t; None at step 0 (no second moment yet)."""
    if moments.step == 0:
        return None
    correction = math.sqrt(1 - moments.beta2**moments.step)
    return {name: 1.0 / (v.double().sqrt() / correction + moments.eps) for name, v in moments.exp_avg_sq.items()}


def next_preconditioner(
    diagonal: torch.Tensor, gradient: torch.Tensor, step: int, beta2: float, eps: float
) -> torch.Tensor:
    """P of the step Adam takes next from the state (step ``step`` + 1), with the full-batch gradient
    ``gradient`` as its g (Cohen et al. 2022 study full-batch Adam): from the applied P =
    1 / (√v̂_t + ε), v_t = (1/P − ε)² (1 − β2^t), then v_{t+1} = β2 v_t + (1 − β2) g² and
    P' = 1 / (√(v_{t+1} / (1 − β2^(t+1))) + ε); float64, as the tensors are laid out."""
    root = (1.0 / diagonal.double() - eps).clamp_min(0.0)
    second = root.square() * (1 - beta2**step)
    following = beta2 * second + (1 - beta2) * gradient.double().square()
    return 1.0 / ((following / (1 - beta2 ** (step + 1))).sqrt() + eps)


def _hyper(group: dict[str, Any]) -> tuple:
    return group["lr"], tuple(group.get("betas", ())), group["eps"]


def _named_entries(groups: list[dict], names: list[list[str]], per_index: dict, source: str):
    """(name, its state entry, its group's decay) of every tensor that was stepped, group by group."""
    for k, (group, group_names) in enumerate(zip(groups, names, strict=True)):
        if len(group["params"]) != len(group_names):
            raise ValueError(
                f"{source}: parameter group {k} holds {len(group['params'])} tensors, {len(group_names)} are named "
                "for it; the groups are mapped wrongly"
            )
        if _hyper(group) != _hyper(groups[0]):
            raise ValueError(f"{source}: parameter groups with different lr, betas or eps are not supported")
        for index, name in zip(group["params"], group_names, strict=True):
            entry = per_index.get(index, {})
            if entry and "exp_avg_sq" not in entry:
                raise ValueError(f"{source}: tensor {index} ({name}) holds no exp_avg_sq: not an Adam state")
            if entry:  # else never stepped
                yield name, entry, float(group.get("weight_decay", 0.0))


def moments_from_optimizer(
    state: dict[str, Any],
    names: list[list[str]] | None = None,
    source: str = "optimizer state",
    lr: float | None = None,
) -> AdamMoments:
    """The moments of a torch Adam/AdamW ``state_dict``, by name: each group's ``param_names`` (or
    ``names``, one list per group, that the caller proves), every group's lr, betas and eps equal;
    ``lr``: the rate the last step applied where the groups hold another (a scheduler's next one).

    Raises:
        ValueError: not an Adam state, groups without names, a group whose count differs from its
            names, or groups that disagree on the hyper-parameters.
    """
    groups, per_index = state.get("param_groups"), state.get("state")
    if not isinstance(groups, list) or not isinstance(per_index, dict) or not groups:
        raise ValueError(f"{source}: not a torch optimizer state (no param_groups and state)")
    if names is None:
        if any("param_names" not in g for g in groups):
            raise ValueError(f"{source}: its parameter groups carry no names, so its moments cannot be placed")
        names = [list(g["param_names"]) for g in groups]
    if len(names) != len(groups):
        raise ValueError(f"{source}: {len(groups)} parameter groups, {len(names)} named")
    if "betas" not in groups[0]:
        raise ValueError(f"{source}: not an Adam optimizer's state (its groups have no betas)")
    exp_avg, exp_avg_sq, decay, steps = {}, {}, {}, set()
    for name, entry, weight_decay in _named_entries(groups, names, per_index, source):
        exp_avg[name], exp_avg_sq[name], decay[name] = entry["exp_avg"], entry["exp_avg_sq"], weight_decay
        steps.add(int(float(entry["step"])))
    if len(steps) > 1:
        raise ValueError(f"{source}: its tensors were stepped {sorted(steps)} times; not one optimizer's state")
    lr = float(groups[0]["lr"]) if lr is None else lr
    beta1, beta2 = (float(b) for b in groups[0]["betas"])
    step = steps.pop() if steps else 0
    return AdamMoments(step, lr, beta1, beta2, float(groups[0]["eps"]), exp_avg, exp_avg_sq, decay, source)


def load_into(optimizer: torch.optim.Optimizer, moments: AdamMoments) -> None:
    """Give an Adam(W) optimizer whose groups carry ``param_names`` these moments, by name (the state
    it would hold after step ``moments.step``; its own lr and decay stay its own).

    Raises:
        ValueError: a group without names, or a parameter the moments do not hold.
    """
    for group in optimizer.param_groups:
        if "param_names" not in group:
            raise ValueError("the optimizer's parameter groups carry no names; moments are placed by name only")
        for name, parameter in zip(group["param_names"], group["params"], strict=True):
            if name not in moments.exp_avg_sq:
                raise ValueError(f"{moments.source}: holds no moments of {name}")
            optimizer.state[parameter] = {
                "step": torch.tensor(float(moments.step)),
                "exp_avg": moments.exp_avg[name].to(parameter).clone(),
                "exp_avg_sq": moments.exp_avg_sq[name].to(parameter).clone(),
            }


def save_moments(path: str | Path, moments: AdamMoments) -> None:
    """Write a moments file (safetensors, atomically)."""
    tensors = {f"exp_avg.{n}": t for n, t in moments.exp_avg.items()}
    tensors |= {f"exp_avg_sq.{n}": t for n, t in moments.exp_avg_sq.items()}
    hyper = {k: json.dumps(getattr(moments, k)) for k in ("step", "lr", "beta1", "beta2", "eps")}
    save_weights(path, tensors, {"format": MOMENTS_FORMAT, **hyper, "weight_decay": json.dumps(moments.weight_decay)})


def load_moments(path: str | Path) -> AdamMoments:
    """Read a moments file.

    Raises:
        ValueError: a file that is not a moments file, naming it.
    """
    tensors, metadata = load_weights(path)
    if metadata.get("format") != MOMENTS_FORMAT:
        raise ValueError(f"{path}: not an optimizer moments file (format {metadata.get('format')!r})")
    parts: dict[str, dict[str, torch.Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
    for key, tensor in tensors.items():
        kind, _, name = key.partition(".")
        parts[kind][name] = tensor
    hyper = {k: json.loads(metadata[k]) for k in ("step", "lr", "beta1", "beta2", "eps")}
    return AdamMoments(
        **hyper,
        exp_avg=parts["exp_avg"],
        exp_avg_sq=parts["exp_avg_sq"],
        weight_decay=json.loads(metadata["weight_decay"]),
        source=Path(path).name,
    )
