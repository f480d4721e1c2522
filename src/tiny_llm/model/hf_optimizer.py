"""A Hugging Face Trainer checkpoint's Adam state (``checkpoint-N/optimizer.pt``) as moments under
our parameter names (:class:`tiny_llm.model.moments.AdamMoments`), for the statistics in the
optimizer's geometry.

The file numbers its tensors by the Trainer's parameter groups, not by the model's order: first
every parameter the Trainer decays (``Trainer.get_decay_parameter_names``: all but biases and
norms), then the rest, each group in ``named_parameters`` order of the Hugging Face model its
config.json builds. That grouping is rebuilt here from the config.json (the model built on the
meta device: no weights, no download; its module names renamed to its checkpoints' as
transformers saves them) and checked against the file group by group: the group
count, each group's size, its decay (the second group's is 0), and every moment's shape against
its parameter's; a state grouped otherwise (another optimizer, hand-made groups, frozen
parameters) is refused by name rather than placed by order. Moments are elementwise, so they take
the weights' own renaming and transposition into our layout (:func:`tiny_llm.model.hf.from_hf_state`).

The step is the state's own; β's and ε the group's; the learning rate the step applied is the one
``trainer_state.json`` logged at that step (the group's ``lr`` is already the scheduler's next
value), None where it was not logged there. Read with ``weights_only=True``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from tiny_llm.config import ModelConfig
from tiny_llm.layout import OPTIMIZER_FILE
from tiny_llm.model.hf import from_hf_state
from tiny_llm.model.hf_positions import read_trainer_state
from tiny_llm.model.moments import AdamMoments, moments_from_optimizer, named_shapes
from tiny_llm.model.pickles import load_pickle

__all__ = ["OPTIMIZER_FILE", "suite_moments", "trainer_groups", "trainer_moments"]


def trainer_groups(config_json: Path) -> tuple[list[list[str]], dict[str, tuple[int, ...]], Callable]:
    """The Trainer's two parameter groups (decayed, then not) of the model ``config_json`` builds,
    by the module's parameter names, every parameter's shape, and the renaming of tensors so named
    to the names its checkpoints are saved under (transformers' own, as ``save_pretrained`` does:
    GPT-NeoX's module ``lm_head`` is saved as ``embed_out``)."""
    import transformers

    hf_config = transformers.AutoConfig.from_pretrained(str(config_json.parent))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decayed = set(transformers.Trainer.get_decay_parameter_names(None, model))  # its own rule; self unused
    groups = [[n for n, _ in named if n in decayed], [n for n, _ in named if n not in decayed]]
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers before 5 saved under the module's names
        return groups, {n: tuple(p.shape) for n, p in named}, lambda tensors: tensors
    return groups, {n: tuple(p.shape) for n, p in named}, lambda tensors: revert_weight_conversion(model, tensors)


def _logged_lr(directory: Path, step: int) -> float | None:
    """The learning rate trainer_state.json logged at ``step`` (the rate that step applied)."""
    state = read_trainer_state(directory) or {}
    for entry in state.get("log_history", []):
        if entry.get("step") == step and isinstance(entry.get("learning_rate"), int | float):
            return float(entry["learning_rate"])
    return None


def trainer_moments(directory: str | Path, config: ModelConfig) -> AdamMoments | None:
    """The Adam moments of a Trainer checkpoint directory under our names, or None without an
    optimizer.pt.

    Raises:
        ValueError: an optimizer.pt that is not a torch Adam/AdamW state grouped as the Trainer
            groups this model, naming the file and the first disagreement.
    """
    directory = Path(directory)
    path = directory / OPTIMIZER_FILE
    if not path.exists():
        return None
    source = f"{directory.name}/{OPTIMIZER_FILE}"
    state = load_pickle(path)
    if not isinstance(state, dict) or not isinstance(state.get("param_groups"), list):
        raise ValueError(f"{source}: not a torch optimizer state")
    groups, shapes, saved_names = trainer_groups(directory / "config.json")
    saved = state["param_groups"]
    if len(saved) != len(groups) or any(len(g["params"]) != len(n) for g, n in zip(saved, groups, strict=True)):
        raise ValueError(
            f"{source}: parameter groups of {[len(g['params']) for g in saved]} tensors, but the Trainer groups this "
            f"model's parameters as {[len(n) for n in groups]} (decayed, then not); it was grouped otherwise, so its "
            "moments cannot be placed"
        )
    if any("betas" not in g for g in saved):
        raise ValueError(f"{source}: not an Adam optimizer's state (its groups have no betas)")
    if float(saved[1].get("weight_decay", 0.0)) != 0.0:
        raise ValueError(f"{source}: its second group is decayed; the Trainer's second group never is")
    step = int(float(next(iter(state["state"].values()), {}).get("step", 0)))
    moments = moments_from_optimizer(state, groups, source, lr=_logged_lr(directory, step))
    for name, tensor in moments.exp_avg_sq.items():
        if tuple(tensor.shape) != shapes[name]:
            raise ValueError(
                f"{source}: exp_avg_sq of {name} has shape {tuple(tensor.shape)}, the parameter {shapes[name]}; "
                "the optimizer state is grouped otherwise"
            )

    def ours(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # elementwise: the weights' renaming
        return from_hf_state(saved_names(dict(tensors)), config, source)

    decay = {n: torch.tensor(w, dtype=torch.float64).expand(shapes[n]) for n, w in moments.weight_decay.items()}
    return replace(
        moments,
        exp_avg=ours(moments.exp_avg),
        exp_avg_sq=ours(moments.exp_avg_sq),
        weight_decay={n: float(t.reshape(-1)[0]) for n, t in ours(decay).items()},
    )


def suite_moments(paths: list[Path], config: ModelConfig, steps: list[int]) -> list[AdamMoments | None]:
    """Each checkpoint directory's moments (:func:`trainer_moments`; None without an optimizer.pt,
    or for an adapter's model, whose names are its own), checked against the model and the
    checkpoint's step (``steps``); nothing is written.

    Raises:
        ValueError: as :func:`trainer_moments`, moments that do not fit the model, or a state of
            another step, naming the file.
    """
    if config.architecture == "hf":
        return [None for _ in paths]
    shapes, found = named_shapes(config), []
    for path, step in zip(paths, steps, strict=True):
        moments = trainer_moments(path, config)
        if moments is not None:
            moments.check(shapes, f"{Path(path).name}/{OPTIMIZER_FILE}")
            if moments.step != step:
                raise ValueError(
                    f"{Path(path).name}/{OPTIMIZER_FILE}: the optimizer state is at step {moments.step}, the "
                    f"checkpoint at step {step}; it belongs to another checkpoint"
                )
        found.append(moments)
    return found
