"""Index the selected checkpoints of a run into unique parameter states (states.json).

Every selected root checkpoint is loaded, verified (the same checks as the analysis worker,
packed workers included) and hashed; checkpoints with the same state key become aliases of one
state, which is then measured once. States are ordered by training position.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tiny_llm.config import load_config
from tiny_llm.layout import RESOLVED
from tiny_llm.workers.loading import load_state
from tiny_llm.workers.selection import select_checkpoints

__all__ = ["index_states"]

log = logging.getLogger(__name__)

STATES_FORMAT = 1


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
