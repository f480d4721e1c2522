"""Index the selected checkpoints of a run into unique parameter states (states.json).

Every selected root checkpoint is loaded, verified (the same checks as the analysis worker,
packed workers included) and hashed; checkpoints with the same state key become aliases of one
state, which is then measured once. States are ordered by training position.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from tiny_llm.config import load_config
from tiny_llm.layout import EPOCH_FILE, FINAL, RESOLVED
from tiny_llm.workers.loading import ROOT_CHECKPOINT, load_state, resolve_checkpoints

__all__ = ["check_selection", "index_states", "select_checkpoints"]

log = logging.getLogger(__name__)

STATES_FORMAT = 1


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
        if re.fullmatch(r"node-\d+", path.parent.name):
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


def index_states(run_dir: str | Path, selection: str | list[str], consensus: bool) -> dict[str, Any]:
    """Unique parameter states of the selected checkpoints, with every alias and its position.

    Returns plain data for states.json: ``{"format", "run", "packed", "workers", "consensus",
    "states": [{"key", "weights_hash", "worker_hashes", "aliases": [{"file", "step", "tokens"}]}]}``.
    """
    run_dir = Path(run_dir)
    config = load_config(run_dir / RESOLVED)
    by_key: dict[str, dict[str, Any]] = {}
    for path in select_checkpoints(run_dir, selection):
        state = load_state(run_dir, [path], config, consensus)
        entry = by_key.setdefault(
            state.key,
            {
                "key": state.key,
                "weights_hash": state.weights_hash,
                "worker_hashes": state.worker_hashes or None,
                "aliases": [],
            },
        )
        entry["aliases"].append(state.aliases[0])  # file names relative to the run: a moved project still works
        log.info("%s -> state %s", path.name, state.key[:12])
    states = sorted(by_key.values(), key=lambda s: (min(a["step"] for a in s["aliases"]), s["aliases"][0]["file"]))
    return {
        "format": STATES_FORMAT,
        "run": str(run_dir),
        "packed": config.training.packed is not None,
        "workers": config.training.workers,
        "consensus": consensus and config.training.packed is not None,
        "states": states,
    }
