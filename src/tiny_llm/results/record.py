"""The campaign record: ``results/<analysis>/campaign.json``, appended by every controller run.

Each workflow run that starts (not a dry run) appends a ``start`` event per analysis: when, the
command, the source hash, the cost line, the walltime rule and the timing entry it uses. Each
collection appends a ``collected`` event: per (state, case) the Slurm job id, node, partition,
workflow attempt and Slurm restarts, the resources requested (walltime minutes, CPUs, memory,
GPUs, threads), the worker's wall time, and the path of the job's log. The
file is rewritten atomically; nothing in it is read back by the pipeline.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tiny_llm.io import atomic_write_json

__all__ = ["append_event", "job_records"]


def append_event(analysis_dir: str | Path, event: dict[str, Any]) -> dict[str, Any]:
    """Append ``event`` (stamped with the time) to ``analysis_dir/campaign.json``; returns the record.

    Raises:
        ValueError: campaign.json exists but is not a campaign record.
    """
    path = Path(analysis_dir) / "campaign.json"
    record: dict[str, Any] = {"format": 1, "events": []}
    if path.exists():
        try:
            record = json.loads(path.read_text())
            record["events"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path} is not a campaign record; move it away and rerun") from None
    record["events"].append({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), **event})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, record)
    return record


def job_records(analysis: str, results: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (state, case) result: where and how it was computed (Slurm job or local)."""
    jobs = []
    for (key, case), result in results.items():
        slurm = result.get("slurm") or {}
        jobs.append(
            {
                "state": key,
                "case": case,
                "slurm_job_id": slurm.get("job_id"),
                "node": slurm.get("node"),
                "partition": slurm.get("partition"),
                "attempt": slurm.get("attempt"),
                "restarts": slurm.get("restarts"),
                "requested": slurm.get("requested"),
                "wall_seconds": (result.get("timing") or {}).get("wall_seconds"),
                "log": f"logs/analyze_state/{analysis}/{key}/{case}.log",
            }
        )
    return jobs
