"""The integrity of a checkpoint suite trained elsewhere, checked before any measurement.

Published suites are not always what their names say: revisions of different steps that serve the
same weights (the final ones, or an earlier step's), swapped revisions, a seed's later steps that
do not continue its own step 0. A curve drawn over such a suite is silently wrong, so every
imported suite is checked and what is found is reported per checkpoint:

* ``identical``: the weights of a checkpoint equal those of another at a different step (by the
  weight files' content before import, :func:`weights_digest`; by the parameter state's hash
  after). The workflow refuses to measure such a suite unless the analysis sets
  ``allow_identical_states: true`` (``--allow-identical-states``), naming the revisions.
* ``final``: a checkpoint before the last whose weights equal the last's (a branch that serves the
  final checkpoint under an earlier step's name).
* ``spike``: its distance from the first checkpoint, ‖θᵢ − θ₀‖, is more than twice that of both
  neighbours (a late revision filed under an early step).
* ``collapse``: its distance from the first is less than half the largest distance of an earlier
  checkpoint that is not a spike (training does not return halfway to its initialisation; an
  early revision filed under a late step does).
* ``init``: a step-0 checkpoint from which the next moved more than four times as fast, per step,
  as training moved on to the one after, ‖θ₁ − θ₀‖/(s₁ − s₀) > 4 ‖θ₂ − θ₁‖/(s₂ − s₁): the step 0 is
  not this run's initialisation (a seed's later revisions that start from another seed's weights
  are a whole initialisation's distance from it).

The rules are plain arithmetic, torch-free, for the planner too; :func:`state_findings` applies
them to the weights themselves (torch imported there).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from tiny_llm.io import cached_sha256
from tiny_llm.model.hf import weight_files

__all__ = [
    "COLLAPSE",
    "INIT",
    "SPIKE",
    "identical_findings",
    "init_findings",
    "path_findings",
    "refuse_identical",
    "state_findings",
    "weights_digest",
]

COLLAPSE = 0.5
"""A distance from the first checkpoint below this fraction of an earlier one's is a collapse."""
SPIKE = 2.0
"""A distance from the first checkpoint above this multiple of both neighbours' is a spike."""
INIT = 4.0
"""A step 0 the next checkpoint moved from this many times faster per step than on to the one after
is not the run's initialisation."""


def weights_digest(folder: str | Path) -> str:
    """A digest of a checkpoint folder's weight files: in the Hugging Face cache each file's blob
    name (the hub's content hash: nothing is read), elsewhere the sha256 of its content."""
    parts = []
    for name in weight_files(Path(folder)):
        path = Path(folder) / name
        target = Path(os.path.realpath(path))
        parts.append(f"{name}:{target.name if target.parent.name == 'blobs' else cached_sha256(path)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def identical_findings(labels: list[str], steps: list[int], keys: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Per checkpoint (by label): the checkpoints of another step whose weights (``keys``: digests
    or state hashes) equal its own, and whether they equal the last checkpoint's."""
    findings: dict[str, list[dict[str, Any]]] = {}
    for i, (label, step, key) in enumerate(zip(labels, steps, keys, strict=True)):
        same = [labels[j] for j in range(len(keys)) if j != i and keys[j] == key and steps[j] != step]
        if same:
            findings.setdefault(label, []).append(
                {"kind": "identical", "detail": f"weights identical to {', '.join(same)} (another step)"}
            )
        if i < len(keys) - 1 and key == keys[-1] and steps[-1] != step:
            findings.setdefault(label, []).append(
                {"kind": "final", "detail": f"weights identical to the final checkpoint {labels[-1]}"}
            )
    return findings


def path_findings(labels: list[str], distances: list[float]) -> dict[str, list[dict[str, Any]]]:
    """Per checkpoint (by label): a distance from the first checkpoint (``distances``, in the
    suite's order) that spikes above twice both neighbours', or collapses below half of the largest
    earlier one that is not a spike (so that one misplaced late revision does not flag every
    checkpoint after it)."""
    findings: dict[str, list[dict[str, Any]]] = {}
    spikes = {i for i in range(1, len(distances) - 1) if distances[i] > SPIKE * max(distances[i - 1], distances[i + 1])}
    for i in sorted(spikes):
        findings.setdefault(labels[i], []).append(
            {
                "kind": "spike",
                "detail": f"‖θ − θ₀‖ = {distances[i]:.4g}, above twice both neighbours' "
                f"({distances[i - 1]:.4g}, {distances[i + 1]:.4g})",
            }
        )
    for i, (label, d) in enumerate(zip(labels, distances, strict=True)):
        earlier = max((distances[j] for j in range(i) if j not in spikes), default=0.0)
        if i not in spikes and earlier > 0 and d < COLLAPSE * earlier:
            findings.setdefault(label, []).append(
                {"kind": "collapse", "detail": f"‖θ − θ₀‖ = {d:.4g}, below half of an earlier one's {earlier:.4g}"}
            )
    return findings


def init_findings(labels: list[str], steps: list[int], first: float, second: float) -> dict[str, list[dict[str, Any]]]:
    """The ``init`` finding of a suite whose first checkpoint is step 0, from ``first`` = ‖θ₁ − θ₀‖
    and ``second`` = ‖θ₂ − θ₁‖ (at least three checkpoints)."""
    if len(steps) < 3 or steps[0] != 0 or first / (steps[1] - steps[0]) <= INIT * second / (steps[2] - steps[1]):
        return {}
    detail = (
        f"‖θ({labels[1]}) − θ({labels[0]})‖ = {first:.4g}, more than {INIT:g}× per step the next "
        f"‖θ({labels[2]}) − θ({labels[1]})‖ = {second:.4g}: not this run's initialisation"
    )
    return {labels[0]: [{"kind": "init", "detail": detail}]}


def state_findings(
    labels: list[str], steps: list[int], states: list[dict[str, Any]]
) -> tuple[dict[str, list[dict[str, Any]]], list[float]]:
    """Every finding of a suite from its weights (state dicts in the suite's order): identical
    states by their hash, and the path from each checkpoint's distance from the first (float64).
    Returns (findings by label, the distances)."""
    from tiny_llm.model.checkpoint import state_hash

    findings = identical_findings(labels, steps, [state_hash(s) for s in states])
    distances = [_distance(s, states[0]) for s in states]
    second = _distance(states[2], states[1]) if len(states) > 2 else 0.0
    found_init = init_findings(labels, steps, distances[1] if len(states) > 1 else 0.0, second)
    for label, found in [*path_findings(labels, distances).items(), *found_init.items()]:
        findings.setdefault(label, []).extend(found)
    return findings, distances


def _distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """‖a − b‖ over every tensor, in float64."""
    import math

    return math.sqrt(math.fsum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a))


def refuse_identical(findings: dict[str, list[dict[str, Any]]], key: str, setting: str) -> None:
    """Refuse a suite in which checkpoints of different steps hold identical weights.

    Raises:
        ValueError: naming ``key``, the checkpoints and the ``setting`` that measures them anyway.
    """
    same = [label for label, found in findings.items() if any(f["kind"] == "identical" for f in found)]
    if same:
        shown = ", ".join(same[:6]) + (f", ... ({len(same)} in all)" if len(same) > 6 else "")
        raise ValueError(
            f"{key}: checkpoints of different steps hold identical weights ({shown}): the suite serves one "
            f"checkpoint under several steps' names; list other revisions, or set {setting} to measure them anyway"
        )
