"""What a campaign will cost, said before it runs: a line per unfinished analysis and seed
experiment (jobs, the work of each, the estimated time and memory) and, under a cluster walltime
rule, every GPU-hour the campaign asks Slurm for; and the campaign record's start event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiny_llm.campaign import plan as cost
from tiny_llm.campaign.cbs import branch_plans
from tiny_llm.campaign.checks import local_device
from tiny_llm.campaign.planned import Campaign
from tiny_llm.campaign.walltimes import Walltimes
from tiny_llm.config import RunConfig
from tiny_llm.geometry.settings import measurement_seconds, measurement_work
from tiny_llm.workers.settings import settings_record

__all__ = ["CostReport"]


class CostReport:
    """The cost lines of a campaign's analyses and experiments."""

    def __init__(self, campaign: Campaign, walltimes: Walltimes):
        self.campaign, self.cluster, self.walltimes = campaign, campaign.cluster, walltimes

    def expected_states(self, analysis: str, run: RunConfig | None) -> tuple[int, str]:
        """States an analysis will measure, for its cost line (an import not yet made: its list)."""
        planned = self.campaign.analyses[analysis]
        if planned.listed is not None and planned.selection == "all":
            return planned.listed, "hf_checkpoints"
        return cost.expected_states(run, planned.run_dir, planned.selection, analysis_dir=f"results/{analysis}")

    def cost_line(self, analysis: str) -> str | None:
        """What an unfinished analysis will cost: jobs, the work of each, and the estimated time
        (None for an existing run without resolved.yaml: refused later, with its reason)."""
        planned = self.campaign.analyses[analysis]
        settings, run = planned.settings, planned.run
        if run is None:
            return None
        workers = run.training.workers if settings.consensus else 0
        device = local_device(settings.device)
        kind = "cpu" if device == "cpu" else self.cluster.gpu_kind or "cuda"
        work = cost.case_work(run, planned.priced, workers, planned.epoch)
        line = cost.cost_line(
            analysis,
            cost.Jobs(*self.expected_states(analysis, run), tuple(planned.cases), planned.ranks),
            work,
            device,
            self.walltimes.timing_entry(analysis, kind),
            self.cluster,
        )
        if planned.spectrum is not None:
            products = cost.spectrum_products(planned.spectrum, 1 + planned.preconditioner)
            line += (
                f"; spectra: ≤ {products} Hessian-vector products per (state, case), each over its "
                f"{work.hvp_microbatches} curvature micro-batches (not in the time above)"
            )
        memory = planned.memory.describe()  # known with the run's configuration
        if settings.memory_budget_gb is None and device != "cpu":
            memory = memory.replace("no budget", "budget: the GPU's free memory at run time, cut to fit")
        return f"{line}; {memory}"

    def cost_lines(self, train_minutes: int | None = None, calibration_minutes: int | None = None) -> list[str]:
        """The cost line of every analysis that has no summary.csv yet, of every seed experiment
        without its comparison and of every critical-batch-size experiment without its table, and
        under a cluster walltime rule the campaign's total request
        (``train_minutes`` and ``calibration_minutes``: the walltimes the profile asks for those jobs)."""
        campaign = self.campaign
        lines = [self.cost_line(name) for name in campaign.analyses if not Path(f"results/{name}/summary.csv").exists()]
        lines += [
            self.experiment_cost_line(name)
            for name in campaign.experiments
            if not Path(f"results/{name}/comparison.csv").exists()
        ]
        for name, cbs in campaign.cbs.items():
            lines += [] if Path(f"results/{name}/cbs.csv").exists() else cbs.cost_lines()
        lines.append(self.campaign_line(train_minutes, calibration_minutes))
        return [line for line in lines if line]

    def requested_hours(self, analysis: str) -> float | None:
        """GPU-hours Slurm is asked for by an analysis's state jobs (None before its calibration)."""
        planned = self.campaign.analyses[analysis]
        run = planned.run
        if run is None:
            return None
        count = self.expected_states(analysis, run)[0]
        gpus = planned.ranks
        if self.cluster.walltime_hours:
            return count * float(self.cluster.walltime_hours) * gpus
        timing_entry = self.walltimes.analysis_entry(analysis)
        if timing_entry is None:
            return None
        settings = planned.settings
        workers = run.training.workers if settings.consensus else 0
        work = cost.case_work(run, planned.priced, workers, planned.epoch)
        each = cost.parallel_seconds(work.seconds(timing_entry["seconds"]), gpus)
        per_job = max(1, min(count, cost.states_per_job(len(planned.cases), each, self.cluster.states_per_job)))
        return -(-count // per_job) * cost.group_minutes(per_job, len(planned.cases), each) / 60 * gpus

    def experiment_cost_line(self, experiment: str) -> str:
        """What a seed experiment will cost: runs × checkpoints measured, and the time."""
        planned = self.campaign.experiments[experiment]
        runs, checkpoints = planned.checkpoints, sum(planned.checkpoints.values())
        settings, run = planned.settings, planned.reference
        work = measurement_work(run, settings)
        line = (
            f"seed experiment {experiment}: {len(runs)} runs (seeds and controls) trained, {checkpoints} checkpoint "
            f"measurements; each: {work['gradient_microbatches']} gradient micro-batches, at most "
            f"{work['hvp_microbatch_passes']} curvature micro-batch passes"
        )
        entry = self.walltimes.geometry_entry(experiment)
        if entry is None:
            return line + f"; time: no timing entry for this setup on {settings.device}"
        each = measurement_seconds(run, settings, entry["seconds"])
        kind = (entry.get("key") or {}).get("device_kind", settings.device)
        return (
            line + f"; at most about {cost.format_seconds(each)} each, {cost.format_seconds(checkpoints * each)} "
            f"in all on {settings.device} (timings measured on {kind}, {entry.get('measured', {}).get('at', '?')[:10]})"
        )

    def _open_measurement_hours(self) -> tuple[int, float]:
        """Checkpoint measurements of unfinished seed experiments, and the GPU-hours they request."""
        open_runs = [
            (name, count)
            for name, experiment in self.campaign.experiments.items()
            for count in experiment.checkpoints.values()
            if not Path(f"results/{name}/comparison.csv").exists()
        ]
        count = sum(n for _, n in open_runs)
        hours = sum(n * self.walltimes.geometry_runtime(e) / 60 for e, n in open_runs)
        return count, hours

    def campaign_line(self, train_minutes: int | None, calibration_minutes: int | None) -> str | None:
        """Under a cluster walltime rule: every GPU-hour the campaign asks Slurm for, training and
        calibration included (None for local runs)."""
        campaign = self.campaign
        if not (self.cluster.walltime_hours or self.cluster.walltime == "estimate"):
            return None
        untrained = [run for run in campaign.trained_runs if not Path(f"runs/{run}/trained.json").exists()]
        open_analyses = [a for a in campaign.analyses if not Path(f"results/{a}/summary.csv").exists()]
        calibrations = [a for a in open_analyses if self.walltimes.calibration_pending(a)] + [
            e for e in campaign.experiments if self.walltimes.geometry_calibration_pending(e)
        ]
        hours = {a: self.requested_hours(a) for a in open_analyses}
        parts, total = [], 0.0
        if untrained:
            training, line = self._training_hours(untrained, train_minutes)
            parts.append(line)
            total += training
        if calibrations:
            each = (calibration_minutes or 60) / 60
            parts.append(f"calibration {len(calibrations)} job(s) × {each:g} h")
            total += len(calibrations) * each
        known = {a: h for a, h in hours.items() if h is not None}
        if known:
            parts.append(f"analyses {sum(known.values()):g} GPU-hours")
            total += sum(known.values())
        measurements, experiment_hours = self._open_measurement_hours()
        if measurements:
            parts.append(f"seed experiments {experiment_hours:g} GPU-hours")
            total += experiment_hours
        if not parts:
            return None
        unknown = sorted(a for a, h in hours.items() if h is None)
        later = f" (+ {', '.join(unknown)}: priced by its calibration)" if unknown else ""
        return f"campaign on Slurm: {' + '.join(parts)} = at most {total:g} GPU-hours requested{later}"

    def _training_hours(self, runs: list[str], train_minutes: int | None) -> tuple[float, str]:
        """GPU-hours the training of ``runs`` asks for, and its part of the campaign line: a run
        trained here the profile's train_run walltime, a critical-batch branch that scaled by its
        tokens."""
        if not train_minutes:
            return 0.0, f"training {len(runs)} run(s) (walltime not set by the profile)"
        plans = branch_plans(self.campaign.cbs)
        base = [run for run in runs if run not in plans]
        branch_hours = sum(plans[run].branch_minutes(train_minutes) for run in runs if run in plans) / 60
        line = f"training {len(base)} run(s) × {train_minutes / 60:g} h"
        if branch_hours:
            line += f" + {len(runs) - len(base)} branch run(s), {branch_hours:g} h (scaled by their tokens)"
        return len(base) * train_minutes / 60 + branch_hours, line

    def start_event(self, analysis: str, command: list[str], source: str) -> dict[str, Any]:
        """The campaign record's start event of an analysis for this controller run."""
        try:
            entry = self.walltimes.analysis_entry(analysis)
        except ValueError:
            entry = None
        return {
            "event": "start",
            "command": command,
            "source": source,
            "cost": self.cost_line(analysis),
            "walltime": self.walltimes.rule(),
            "timing_entry": entry,
            "settings": settings_record(self.campaign.analyses[analysis].settings),
        }
