"""Studies across seeds (``seed_studies``): several analyses of one model trained from different
seeds (PolyPythia's repositories, each its own analysis), drawn side by side. Planned here: the
analyses named must exist and be two or more, and the seeds' checkpoints are compared across seeds
by their weight digests (the same ones the integrity gate reads): a checkpoint of one seed whose
weights another seed's checkpoint has too (a shared step 0, or a repository filed under the wrong
seed) is said in the log and under the study's figure. The table and figure:
:mod:`tiny_llm.results.seeds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["StudyPlan", "plan_seed_studies"]


@dataclass(frozen=True)
class StudyPlan:
    """One study: its seeds' analyses, and what was found shared between them."""

    analyses: tuple[str, ...]
    shared: tuple[str, ...]
    """Checkpoints with the weights of another seed's, in words."""

    def summaries(self) -> dict[str, str]:
        return {name: f"results/{name}/summary.csv" for name in self.analyses}

    @staticmethod
    def targets(name: str) -> list[str]:
        return [f"results/{name}/seeds.csv", *(f"results/{name}/figures/seeds.{ext}" for ext in ("pdf", "png"))]


def plan_seed_studies(studies: dict[str, Any], analyses: dict[str, Any], runs: Any) -> dict[str, StudyPlan]:
    """Every study of the configuration, checked (``runs``: the planned runs, whose ``digests`` are
    each imported analysis's checkpoints' weight digests by label); weights shared across seeds are
    said in ``runs.notes``.

    Raises:
        ValueError: naming the key: fewer than two analyses, one named twice or unknown, a name
            that is an analysis's too.
    """
    planned = {}
    for name, entry in studies.items():
        key = f"seed_studies.{name}"
        members = (entry or {}).get("analyses") if isinstance(entry, dict) else None
        if not isinstance(members, list) or len(members) < 2 or len(set(members)) != len(members):
            raise ValueError(f"{key}.analyses: list two or more analyses, one per seed, each once; got {members!r}")
        unknown = [m for m in members if m not in analyses]
        if unknown:
            raise ValueError(
                f"{key}.analyses: {', '.join(map(str, unknown))} not among the analyses ({', '.join(analyses)})"
            )
        if name in analyses:
            raise ValueError(f"{key}: results/{name} is analysis {name}'s; give the study another name")
        planned[name] = StudyPlan(tuple(members), tuple(_shared(members, runs.digests)))
        runs.notes.extend(f"{key}: {shared}" for shared in planned[name].shared)
    return planned


def _shared(members: list[str], digests: dict[str, list[tuple[str, str]]]) -> list[str]:
    """Checkpoints of different seeds with the same weights, in words."""
    holders: dict[str, list[str]] = {}
    for member in members:
        for label, digest in digests.get(member, []):
            holders.setdefault(digest, []).append(f"{member} {label}")
    return [
        f"{', '.join(found)} are the same weights"
        for found in holders.values()
        if len({f.split(" ")[0] for f in found}) > 1
    ]
