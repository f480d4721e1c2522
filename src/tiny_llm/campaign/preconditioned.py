"""``preconditioned: true`` checked before the first job: every selected state must have the
optimizer's preconditioner the measurement would take (:mod:`tiny_llm.workers.preconditioning` reads
it): Adam's second moments kept beside each checkpoint (a run trained here with
``training.keep_moments``; a Trainer checkpoint's ``optimizer.pt``), or P = I for a run trained here
with SGD. What has none (the initialisation, a packed run, a suite that published its weights only)
is named at start-up, instead of failing on its state once the measurement reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tiny_llm.config import RunConfig
from tiny_llm.layout import FINAL, OPTIMIZER_FILE, epoch_file, moments_file

__all__ = [
    "Selected",
    "check_preconditioned",
    "imported_states",
    "plan_preconditioner",
    "trained_states",
    "without_preconditioner",
]


@dataclass(frozen=True)
class Selected:
    """A state an analysis will measure: its name as the user knows it (a checkpoint file, or an
    imported revision), its step, and the folder its optimizer state would be in (an imported
    checkpoint's directory; None for a run trained here)."""

    label: str
    step: int
    directory: Path | None = None
    without: str | None = None
    """Why it has none whatever its files hold (an adapter's import keeps no optimizer state)."""


def _without(state: Selected, config: RunConfig, run_dir: Path) -> str | None:
    """Why ``state`` has no preconditioner (None: it has one)."""
    training = config.training
    if state.without:
        return state.without
    if training.packed is not None:
        return "a packed run's workers each keep their own optimizer state"
    if state.directory is None and training.optimizer == "sgd":
        return None  # P = I
    if state.step == 0:
        return "at step 0 Adam has no second moment yet"
    if state.directory is not None:
        return None if (state.directory / OPTIMIZER_FILE).exists() else f"no {OPTIMIZER_FILE} (weights only)"
    moments = moments_file(state.label)
    if state.label == FINAL or (moments and (training.keep_moments or (run_dir / moments).exists())):
        return None
    return "trained without training.keep_moments"


def trained_states(config: RunConfig, selection: str | list[str]) -> list[Selected]:
    """The states of a run trained here that an analysis selects (``all``: every checkpoint its
    training writes), by file and step."""
    per_epoch = config.local_steps_per_epoch
    interval = config.training.checkpoint_policy == "interval"
    files = [epoch_file(e) for e in range(config.training.epochs + 1)] if interval else [FINAL]
    chosen = files if selection == "all" else [Path(f).name for f in selection]
    steps = {epoch_file(e): e * per_epoch for e in range(config.training.epochs + 1)}
    return [Selected(f, steps.get(f, config.training.epochs * per_epoch)) for f in chosen]


def imported_states(
    checkpoints: list[dict], steps: list[int], selection: str | list[str], adapter: bool = False
) -> list[Selected]:
    """The states of a suite the workflow imports (its ``hf_checkpoints`` entries and their steps,
    imported as ``epoch-NNN`` in order) that an analysis selects, by revision (or folder) name; an
    ``adapter``'s import keeps no optimizer state."""
    without = "an adapter's import keeps no optimizer state" if adapter else None
    states = [
        Selected(c.get("revision") or Path(c["path"]).name, step, Path(c["path"]), without)
        for c, step in zip(checkpoints, steps, strict=True)
    ]
    if selection == "all":
        return states
    chosen = {Path(f).name for f in selection}
    return [s for index, s in enumerate(states) if epoch_file(index) in chosen]


def without_preconditioner(config: RunConfig, run_dir: str | Path, states: list[Selected]) -> list[tuple[str, str]]:
    """The selected states that have no preconditioner, each with why: (label, reason)."""
    return [(s.label, why) for s in states if (why := _without(s, config, Path(run_dir)))]


def check_preconditioned(key: str, config: RunConfig, run_dir: str | Path, states: list[Selected]) -> None:
    """Refuse ``preconditioned: true`` (``key``: the setting's config key) when a selected state has
    no preconditioner, naming the states and why.

    Raises:
        ValueError: one line: the states (the first six), the reason, and the settings that work.
    """
    missing = without_preconditioner(config, run_dir, states)
    if missing:
        raise ValueError(_refusal(key, missing, len(states)))


def _refusal(key: str, missing: list[tuple[str, str]], selected: int) -> str:
    """``preconditioned: true``'s refusal of the ``missing`` states of ``selected`` (the first six named)."""
    reasons = sorted({why for _, why in missing})
    names = ", ".join(label for label, _ in missing[:6]) + (", ..." if len(missing) > 6 else "")
    return (
        f"{key}: true, but {len(missing)} of the {selected} selected states have no optimizer preconditioner "
        f"({names}: {'; '.join(reasons)}); set preconditioned: auto (their preconditioned statistics blank, the "
        "others measured) or false, or select only states that have one (checkpoints)"
    )


def plan_preconditioner(
    key: str, asked: bool | str, config: RunConfig, run_dir: str | Path, states: list[Selected]
) -> str | None:
    """The ``preconditioned`` setting ``asked`` (``key``: its config key) for ``states``: true is
    checked (as :func:`check_preconditioned`); where no state has a preconditioner, the note saying
    that the preconditioned figures are not drawn (None: some state has one, or ``asked`` is false).

    Raises:
        ValueError: as :func:`check_preconditioned`, with ``preconditioned: true``.
    """
    if asked is False:
        return None
    missing = without_preconditioner(config, run_dir, states)
    if asked is True and missing:
        raise ValueError(_refusal(key, missing, len(states)))
    if len(missing) < len(states):
        return None
    reasons = "; ".join(sorted({why for _, why in missing}))
    return (
        f"no state it selects has the optimizer's preconditioner ({reasons}); its preconditioned figures are not drawn"
    )
