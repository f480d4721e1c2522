"""Several short states in one cluster job, so that a suite's hundreds of minute-long states do not
flood the queue with one-minute jobs.

The (state, case) jobs of one state, its spectra and its ``finish_state`` form one connected group
(``analysis-<name>``, one group name per analysis); Snakemake's group components then pack that many
such groups into one cluster job, run one after another (a job's ``state_slot`` is one), whose
walltime is the sum of theirs. How many is decided per analysis by
:meth:`~tiny_llm.campaign.walltimes.Walltimes.states_per_job` (``cluster.states_per_job``) and asked
when the groups are formed, which is after a pending calibration has measured the setup. A
profile's ``group-components: analysis: N`` still applies, to every analysis. A dry run lists one
group per state (its cost line counts the packed jobs): Snakemake 9.27's dry run repeats packed
groups in its listing, without end at a suite's size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["GROUP", "StatesPerJob", "analysis_group", "pack_states", "state_group"]

GROUP = "analysis"
"""The group name a profile's ``group-components`` gives for every analysis."""


def state_group(analysis: str) -> str:
    """The group of an analysis's state jobs."""
    return f"{GROUP}-{analysis}"


class StatesPerJob(Mapping[str, int]):
    """Snakemake's group components: the profile's, and one entry per analysis group, computed when
    asked (so an estimate measured by this run's calibration counts)."""

    def __init__(self, given: Mapping[str, int], analyses: list[str], states_per_job: Callable[[str], int]):
        self.given, self.analyses, self.states_per_job = dict(given), list(analyses), states_per_job

    def __getitem__(self, key: str) -> int:
        for analysis in self.analyses:
            if key == state_group(analysis):
                return self.given.get(key) or self.given.get(GROUP) or self.states_per_job(analysis)
        return self.given[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.given
        yield from (state_group(a) for a in self.analyses if state_group(a) not in self.given)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def pack_states(workflow: Any, analyses: Mapping[str, Any], states_per_job: Callable[[str], int]) -> None:
    """Installs :class:`StatesPerJob` as the workflow's group components, once. Called by the
    rules' group function, so while the DAG is built: Snakemake replaces the settings it parsed the
    Snakefile with by the run's before that."""
    settings = workflow.group_settings
    if workflow.dryrun:  # Snakemake 9's dry run lists packed groups over and over (GBs for a suite)
        return
    if not isinstance(settings.group_components, StatesPerJob):
        settings.group_components = StatesPerJob(settings.group_components, list(analyses), states_per_job)


def analysis_group(workflow: Any, plan: Any, analysis: str) -> str:
    """The rules' group function: the group of an analysis's state jobs, with the packing installed
    (``plan``: the :class:`~tiny_llm.campaign.workflow.WorkflowPlan`)."""
    pack_states(workflow, plan.analyses, plan.walltimes.states_per_job)
    return state_group(analysis)
