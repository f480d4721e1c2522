"""What the campaign's parts are given: each analysis and seed experiment as the workflow planned
it, typed and frozen, and the campaign that holds them.

:class:`~tiny_llm.campaign.workflow.WorkflowPlan` checks a configuration and builds one
:class:`Campaign`; the walltimes (:mod:`tiny_llm.campaign.walltimes`), the cost lines
(:mod:`tiny_llm.campaign.costs`) and the targets of ``rule all`` (:mod:`tiny_llm.campaign.targets`)
take it and nothing else, so none of them reaches back into the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tiny_llm.campaign.plan import ClusterSettings
from tiny_llm.config import RunConfig
from tiny_llm.workers.settings import AnalysisSettings, SpectrumSettings

if TYPE_CHECKING:
    from tiny_llm.campaign.cbs import CbsPlan
    from tiny_llm.curvature.memory import MemoryPlan
    from tiny_llm.geometry.settings import GeometrySettings

__all__ = ["AnalysisPlan", "Campaign", "ExperimentPlan"]


@dataclass(frozen=True)
class AnalysisPlan:
    """One analysis as planned: its checked settings and what its jobs are."""

    name: str
    settings: AnalysisSettings
    run: RunConfig | None
    """The run's configuration (planned for a run trained or imported here); None for an existing
    run directory without resolved.yaml (refused when its jobs start, with the reason)."""
    run_dir: str
    selection: str | list[str]
    """``all`` or the listed root checkpoint files."""
    listed: int | None
    """Checkpoints of an import the workflow has not made yet (its hf_checkpoints); else None."""
    cases: tuple[str, ...]
    ranks: int
    """Ranks of one (state, case) job: gpus_per_job × nodes_per_job."""
    spectrum: SpectrumSettings | None
    """Its spectra's settings (None: no spectra)."""
    preconditioner: bool
    """Whether a selected state may have the optimizer's preconditioner (its figures are drawn)."""
    memory: MemoryPlan | None
    """The memory plan of its (state, case) jobs (None while the run's configuration is unknown)."""
    epoch: tuple[int, int] | None = None
    """A case's (noise batches, sequences a batch) where they are not the run's epoch: a training
    order's window."""

    @property
    def priced(self) -> AnalysisSettings:
        """The settings as its jobs will run: without the optimizer's geometry where no selected
        state has its preconditioner (what the price counts)."""
        return self.settings if self.preconditioner else replace(self.settings, preconditioned=False)


@dataclass(frozen=True)
class ExperimentPlan:
    """One seed experiment as planned."""

    name: str
    settings: GeometrySettings
    calibration: AnalysisSettings
    """The analysis setup whose timing entry prices its measurements."""
    reference: RunConfig
    """Its first run's configuration (the reference set's data and batch)."""
    checkpoints: dict[str, int]
    """Checkpoints measured per run (seeds and controls)."""
    walltime_minutes: int
    """Its measurements' walltime when no estimate applies."""


@dataclass(frozen=True)
class Campaign:
    """Everything a campaign's walltimes, costs and targets need."""

    cluster: ClusterSettings
    analyses: dict[str, AnalysisPlan]
    experiments: dict[str, ExperimentPlan]
    trained_runs: tuple[str, ...]
    """The runs this workflow trains."""
    comparisons: tuple[str, ...]
    """The seed comparisons."""
    cbs: dict[str, CbsPlan] = field(default_factory=dict)
    """The critical-batch-size experiments (their runs and analyses are among the others)."""
    studies: tuple[str, ...] = ()
    """The studies across seeds (their analyses are among the others)."""
