"""The walltime of every cluster job, and whether it waits for a calibration.

:class:`Walltimes` answers, for an analysis or a seed experiment of a planned
:class:`~tiny_llm.campaign.planned.Campaign`, how many minutes Slurm is asked for and which
calibration job a walltime waits for, from its typed cluster settings and the timing profiles:
``cluster.walltime_hours`` when set; under ``cluster.walltime: estimate``, 2 × the estimated work
+ 30 min per state, rounded up to the hour; otherwise the defaults of a local run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tiny_llm.campaign import plan as cost
from tiny_llm.campaign import timing
from tiny_llm.campaign.planned import Campaign
from tiny_llm.config import RunConfig
from tiny_llm.geometry.settings import measurement_seconds
from tiny_llm.workers.settings import AnalysisSettings

__all__ = ["Walltimes"]


class Walltimes:
    """Walltimes and calibrations of a campaign's jobs (decided once per workflow run)."""

    def __init__(self, campaign: Campaign):
        self.analyses, self.experiments, self.cluster = campaign.analyses, campaign.experiments, campaign.cluster
        self._pending: dict[str, bool] = {}
        self._packed: dict[str, int] = {}

    # --- timing entries -----------------------------------------------------------------------

    def _lookup(self, run: RunConfig, settings: AnalysisSettings, device_kind: str | None) -> dict[str, Any] | None:
        key = timing.timing_key(run, settings, device_kind="")
        return timing.lookup_entry(timing.load_profiles(self.cluster.timing_profiles), key, device_kind)

    def timing_entry(self, analysis: str, device_kind: str | None) -> dict[str, Any] | None:
        """The timing entry measured for an analysis's setup on a device whose kind contains
        ``device_kind`` (any when None), from ``cluster.timing_profiles``; None when there is none."""
        planned = self.analyses[analysis]
        if planned.run is None:
            return None
        return self._lookup(planned.run, planned.settings, device_kind)

    def analysis_entry(self, analysis: str) -> dict[str, Any] | None:
        """The timing entry of an analysis on the cluster's GPU kind."""
        return self.timing_entry(analysis, self.cluster.gpu_kind)

    def geometry_entry(self, experiment: str) -> dict[str, Any] | None:
        """The timing entry of a seed experiment's measurement setup on the cluster's GPU kind."""
        planned = self.experiments[experiment]
        return self._lookup(planned.reference, planned.calibration, self.cluster.gpu_kind)

    # --- calibrations -------------------------------------------------------------------------

    def _pending_for(self, name: str, entry_of: Callable[[str], dict[str, Any] | None]) -> bool:
        """Decided once per workflow run (analysis and experiment names never coincide)."""
        if name not in self._pending:
            self._pending[name] = self.cluster.estimated and entry_of(name) is None
        return self._pending[name]

    def calibration_pending(self, analysis: str) -> bool:
        """Whether the walltime estimate of an analysis waits for its calibration job: walltimes are
        estimated and no timing entry (committed, or measured by an earlier calibration of any
        analysis with the same setup) covers it yet. Decided once per workflow run."""
        return self._pending_for(analysis, self.analysis_entry)

    def geometry_calibration_pending(self, experiment: str) -> bool:
        """Whether an experiment's measurement walltimes wait for its calibration job: walltimes are
        estimated and no timing entry covers the measurement setup yet."""
        return self._pending_for(experiment, self.geometry_entry)

    def calibration(self, analysis: str) -> list[str]:
        """The calibration an analysis job's walltime waits for (none when a timing entry exists)."""
        return [f"results/timing/{analysis}.json"] if self.calibration_pending(analysis) else []

    def geometry_calibration(self, experiment: str) -> list[str]:
        """The calibration a seed experiment's measurement walltimes wait for."""
        return [f"results/timing/{experiment}.json"] if self.geometry_calibration_pending(experiment) else []

    # --- minutes ------------------------------------------------------------------------------

    def case_work_seconds(self, analysis: str) -> float | None:
        """Estimated work of one (state, case) job from the timing profiles, or None (no estimate).

        Raises:
            ValueError: walltimes are estimated and no timing entry covers the setup.
        """
        if self.cluster.walltime != "estimate":
            return None
        planned = self.analyses[analysis]
        run, settings = planned.run, planned.settings
        if run is None:
            raise ValueError(f"analysis {analysis}: {planned.run_dir} has no resolved.yaml; train or import it first")
        entry = self.analysis_entry(analysis)
        if entry is None:
            key = timing.timing_key(run, settings, device_kind="")
            raise ValueError(
                f"no timing profile covers analysis {analysis} ({key}); run "
                "`snakemake --profile <profile> calibrate` on the target node first, or set "
                "cluster.walltime_hours to request an explicit walltime"
            )
        workers = run.training.workers if settings.consensus else 0
        one = cost.estimate_seconds(run, planned.priced, entry["seconds"], workers if workers > 1 else 0, planned.epoch)
        return cost.parallel_seconds(one, planned.ranks)

    def states_per_job(self, analysis: str) -> int:
        """States one cluster job of an analysis measures, one after another (``cluster.states_per_job``;
        under auto, packed by the walltime estimate, else one)."""
        setting = self.cluster.states_per_job
        if setting != "auto" or not self.cluster.estimated:
            states = 1 if setting == "auto" else int(setting)
            if self.cluster.walltime_hours:
                cost.check_packing(analysis, states, lambda n: n * float(self.cluster.walltime_hours) * 60)
            elif self.cluster.estimated and (work := self._known_work(analysis)) is not None:
                cases = len(self.analyses[analysis].cases)
                cost.check_packing(analysis, states, lambda n: cost.group_minutes(n, cases, work))
            return states
        if analysis not in self._packed:
            try:
                work = self.case_work_seconds(analysis)
            except ValueError:  # not measured yet: asked again once the calibration has run
                return 1
            self._packed[analysis] = cost.states_per_job(len(self.analyses[analysis].cases), work)
        return self._packed[analysis]

    def _known_work(self, analysis: str) -> float | None:
        """The estimated work of one (state, case) job, None while it is not measured."""
        try:
            return self.case_work_seconds(analysis)
        except ValueError:
            return None

    def _explicit_minutes(self, analysis: str) -> tuple[int, int]:
        """``cluster.walltime_hours`` as minutes per state job, split over its group's jobs: each
        case gets an equal share, finish_state the rest (at least one minute; none is ever 0)."""
        total = int(self.cluster.walltime_hours * 60)
        cases = len(self.analyses[analysis].cases)
        share = max(1, (total - 1) // cases)
        return share, max(1, total - cases * share)

    def analyze_runtime(self, analysis: str) -> int:
        """Minutes for one (state, case): 2 × estimated work; the group's rounding and the 30-minute
        margin are carried by finish_state (see :meth:`finish_runtime`). Analysis jobs exist only
        after the index, which waits for a pending calibration, so its timings are there."""
        if self.cluster.walltime_hours:
            return self._explicit_minutes(analysis)[0]
        work = self.case_work_seconds(analysis)
        return 60 if work is None else math.ceil(2 * work / 60)

    def finish_runtime(self, analysis: str) -> int:
        """Completes the group of one state to 2 × work + 30 min, rounded up to the hour (≤ 72 h):
        a group job's runtime is the sum of its jobs' runtimes (they run one after another). In a
        job of several short states each carries its share of that margin."""
        if self.cluster.walltime_hours:
            return self._explicit_minutes(analysis)[1]
        work = self.case_work_seconds(analysis)
        if work is None:
            return 5
        return cost.finish_minutes(len(self.analyses[analysis].cases), work, self.states_per_job(analysis))

    def geometry_runtime(self, experiment: str) -> int:
        """Minutes for one checkpoint's measurement: ``cluster.walltime_hours`` when set; under
        ``cluster.walltime: estimate``, 2 × estimated work + 30 min rounded up to the hour from the
        timing entry of the setup (measured first by calibrate_geometry when there is none: the
        measurement jobs are planned after it); else the experiment's ``walltime_minutes``."""
        if self.cluster.walltime_hours:
            return int(self.cluster.walltime_hours * 60)
        if self.cluster.walltime == "estimate":
            entry = self.geometry_entry(experiment)
            if entry is not None:
                planned = self.experiments[experiment]
                return cost.job_minutes(measurement_seconds(planned.reference, planned.settings, entry["seconds"]))
        return self.experiments[experiment].walltime_minutes

    def rule(self) -> str:
        """The walltime rule in force, in words (for the campaign record)."""
        if self.cluster.walltime_hours:
            return f"cluster.walltime_hours: {self.cluster.walltime_hours:g} per state job"
        if self.cluster.walltime == "estimate":
            return "2 x estimated work + 30 min per state job, rounded up to the hour"
        return "none (local run, or the profile's default)"
