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

from tiny_llm.analysis import load_state, resolve_checkpoints
from tiny_llm.config import load_config

__all__ = ["index_states", "select_checkpoints"]

log = logging.getLogger(__name__)

STATES_FORMAT = 1
_EPOCH = re.compile(r"^epoch-(\d+)\.safetensors$")


def select_checkpoints(run_dir: str | Path, selection: str | list[str]) -> list[Path]:
    """``"all"`` (every epoch-NNN.safetensors, then final.pt) or a list of names relative to the
    run directory or absolute root-checkpoint paths; worker files are refused.

    Raises:
        ValueError: nothing to analyse, or a file that is not a root checkpoint of the run.
    """
    run_dir = Path(run_dir)
    if selection == "all":
        names = sorted((p.name for p in run_dir.glob("epoch-*.safetensors") if _EPOCH.match(p.name)),
                       key=lambda n: int(_EPOCH.match(n).group(1)))
        names += ["final.pt"] if (run_dir / "final.pt").exists() else []
        if not names:
            raise ValueError(f"{run_dir} holds no checkpoints (epoch-NNN.safetensors or final.pt); "
                             "train with training.checkpoint_policy=interval or select files explicitly")
    elif isinstance(selection, list) and selection:
        names = selection
    else:
        raise ValueError(f"checkpoints: expected 'all' or a non-empty list of files, got {selection!r}")
    return resolve_checkpoints(run_dir, names)


def index_states(run_dir: str | Path, selection: str | list[str], consensus: bool) -> dict[str, Any]:
    """Unique parameter states of the selected checkpoints, with every alias and its position.

    Returns plain data for states.json: ``{"format", "run", "packed", "workers", "consensus",
    "states": [{"key", "weights_hash", "worker_hashes", "aliases": [{"file", "step", "tokens"}]}]}``.
    """
    run_dir = Path(run_dir)
    config = load_config(run_dir / "resolved.yaml")
    by_key: dict[str, dict[str, Any]] = {}
    for path in select_checkpoints(run_dir, selection):
        state = load_state(run_dir, [path], config, consensus)
        entry = by_key.setdefault(state.key, {"key": state.key, "weights_hash": state.weights_hash,
                                              "worker_hashes": state.worker_hashes or None, "aliases": []})
        entry["aliases"].append(state.aliases[0] | {"path": str(path)})
        log.info("%s -> state %s", path.name, state.key[:12])
    states = sorted(by_key.values(), key=lambda s: (min(a["tokens"] for a in s["aliases"]), s["aliases"][0]["file"]))
    return {"format": STATES_FORMAT, "run": str(run_dir), "packed": config.training.packed is not None,
            "workers": config.training.workers, "consensus": consensus and config.training.packed is not None,
            "states": states}
