"""Which checkpoints of a run an analysis measures: ``all`` or a list of root checkpoints, each
resolved in the run directory (worker files refused), and checked at the workflow's start-up
against what training will write. Torch-free, for the planner.
"""

from __future__ import annotations

import re
from pathlib import Path

from tiny_llm.layout import EPOCH_FILE, FINAL

__all__ = ["ROOT_CHECKPOINT", "check_selection", "resolve_checkpoints", "select_checkpoints"]

ROOT_CHECKPOINT = re.compile(r"^(epoch-\d+\.safetensors|final\.pt)$")
"""A run's root (averaged) checkpoint file names."""
_WORKER_DIR = re.compile(r"^node-\d+$")


def resolve_checkpoints(run_dir: Path, names: list[str]) -> list[Path]:
    """Checkpoint paths (relative to the run directory, or absolute), root checkpoints only.

    Raises:
        ValueError: worker files, files outside the run directory, unknown or missing files.
    """
    if not names:
        raise ValueError("no checkpoint given")
    run_dir = run_dir.resolve()
    paths = []
    for name in names:
        path = Path(name) if Path(name).is_absolute() else run_dir / name
        path = path.resolve()
        if _WORKER_DIR.match(path.parent.name) and path.parent.parent == run_dir:
            raise ValueError(
                f"{name} is a worker checkpoint; analyse the root (averaged) checkpoint "
                f"{path.name} instead: worker states enter through the consensus analysis"
            )
        if path.parent != run_dir or not ROOT_CHECKPOINT.match(path.name):
            raise ValueError(f"{name}: expected a root checkpoint of {run_dir} (epoch-NNN.safetensors or final.pt)")
        if not path.exists():
            raise ValueError(f"checkpoint {path} does not exist")
        paths.append(path)
    return paths


def select_checkpoints(run_dir: str | Path, selection: str | list[str]) -> list[Path]:
    """``"all"`` (every epoch-NNN.safetensors, then final.pt) or a list of names relative to the
    run directory or absolute root-checkpoint paths; worker files are refused.

    Raises:
        ValueError: nothing to analyse, or a file that is not a root checkpoint of the run.
    """
    run_dir = Path(run_dir)
    if selection == "all":
        names = sorted(
            (p.name for p in run_dir.glob("epoch-*.safetensors") if EPOCH_FILE.match(p.name)),
            key=lambda n: int(EPOCH_FILE.match(n).group(1)),
        )
        names += [FINAL] if (run_dir / FINAL).exists() else []
        if not names:
            raise ValueError(
                f"{run_dir} holds no checkpoints (epoch-NNN.safetensors or final.pt); "
                "train with training.checkpoint_policy=interval or select files explicitly"
            )
    elif isinstance(selection, list) and selection:
        names = selection
    else:
        raise ValueError(f"checkpoints: expected 'all' or a non-empty list of files, got {selection!r}")
    return resolve_checkpoints(run_dir, names)


def check_selection(
    key: str, run_dir: str | Path, selection: str | list[str], will_write: set[str] | None = None
) -> None:
    """Check a configured checkpoint selection before any work (the workflow's start-up): worker
    files, files that are not root checkpoints, and files that will not be there: for a run this
    workflow trains, names outside ``will_write`` (the root checkpoints its training writes); for
    any other run, files that are missing.

    Raises:
        ValueError: naming the config ``key``, the file and the fix.
    """
    if selection == "all" or not isinstance(selection, list):
        return
    run_dir = Path(run_dir)
    for name in selection:
        path = Path(str(name))
        if _WORKER_DIR.match(path.parent.name):
            raise ValueError(
                f"{key}: {name} is a worker checkpoint; list the root (averaged) checkpoint "
                f"{path.name} instead: worker states enter through the consensus analysis"
            )
        if not ROOT_CHECKPOINT.match(path.name):
            raise ValueError(f"{key}: {name} is not a root checkpoint (epoch-NNN.safetensors or final.pt)")
        if will_write is not None and not path.is_absolute():
            if str(path) not in will_write:
                raise ValueError(
                    f"{key}: {name} is not a checkpoint that training {run_dir} writes "
                    f"({', '.join(sorted(will_write))}); list some of those or use all"
                )
        elif not (path if path.is_absolute() else run_dir / path).exists():
            raise ValueError(f"{key}: {name} does not exist in {run_dir}; list existing checkpoints or use all")
