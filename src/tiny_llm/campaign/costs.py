"""What a campaign will cost, said before it runs: a line per unfinished analysis and seed
experiment (jobs, the work of each, the estimated time and memory) and, under a cluster walltime
rule, every GPU-hour the campaign asks Slurm for; and the campaign record's start event.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiny_llm.campaign import plan as cost
from tiny_llm.config import RunConfig
from tiny_llm.geometry.experiment import geometry_settings_from_dict, measurement_seconds, measurement_work
from tiny_llm.layout import IMPORTED
from tiny_llm.workers.settings import settings_record

if TYPE_CHECKING:
    from tiny_llm.campaign.workflow import WorkflowPlan

__all__ = ["CostReport"]


class CostReport:
    """The cost lines of a plan's analyses and experiments."""

    def __init__(self, plan: WorkflowPlan):
        self.plan = plan
        self.cluster, self.walltimes = plan.cluster, plan.walltimes

    def expected_states(self, analysis: str, run: RunConfig) -> tuple[int, str]:
        """States an analysis will measure, for its cost line (an import not yet made: its list)."""
        entry = self.plan.analyses[analysis]
        selection = entry.get("checkpoints", "all")
        if analysis in self.plan.imports and selection == "all" and not (Path(entry["run"]) / IMPORTED).exists():
            return len(entry["hf_checkpoints"]), "hf_checkpoints"
        return cost.expected_states(run, entry["run"], selection, analysis_dir=f"results/{analysis}")

    def cost_line(self, analysis: str) -> str | None:
        """What an unfinished analysis will cost: jobs, the work of each, and the estimated time
        (None for an existing run without resolved.yaml: refused later, with its reason)."""
        plan = self.plan
        settings = plan.analysis_settings[analysis]
        try:
            run = plan.run_config(analysis)
        except ValueError:
            return None
        workers = run.training.workers if settings.consensus else 0
        kind = "cpu" if settings.device == "cpu" else self.cluster.gpu_kind or "cuda"
        line = cost.cost_line(
            analysis,
            self.expected_states(analysis, run),
            plan.cases(analysis),
            cost.case_work(run, settings, workers),
            settings.device,
            self.walltimes.timing_entry(analysis, kind),
            self.cluster,
            plan.job_ranks(analysis),
        )
        memory = plan.memory(analysis).describe()
        if settings.memory_budget_gb is None and settings.device != "cpu":
            memory = memory.replace("no budget", "budget: the GPU's free memory at run time, cut to fit")
        return f"{line}; {memory}"

    def cost_lines(self, train_minutes: int | None = None, calibration_minutes: int | None = None) -> list[str]:
        """The cost line of every analysis that has no summary.csv yet and of every seed experiment
        without its comparison, and under a cluster walltime rule the campaign's total request
        (``train_minutes`` and ``calibration_minutes``: the walltimes the profile asks for those jobs)."""
        plan = self.plan
        lines = [self.cost_line(name) for name in plan.analyses if not Path(f"results/{name}/summary.csv").exists()]
        lines += [
            self.experiment_cost_line(name)
            for name in plan.seed_experiments
            if not Path(f"results/{name}/comparison.csv").exists()
        ]
        lines.append(self.campaign_line(train_minutes, calibration_minutes))
        return [line for line in lines if line]

    def requested_hours(self, analysis: str) -> float | None:
        """GPU-hours Slurm is asked for by an analysis's state jobs (None before its calibration)."""
        plan = self.plan
        try:
            run = plan.run_config(analysis)
        except ValueError:
            return None
        count = self.expected_states(analysis, run)[0]
        gpus = plan.job_ranks(analysis)
        if self.cluster.walltime_hours:
            return count * float(self.cluster.walltime_hours) * gpus
        timing_entry = self.walltimes.analysis_entry(analysis)
        if timing_entry is None:
            return None
        settings = plan.analysis_settings[analysis]
        workers = run.training.workers if settings.consensus else 0
        each = cost.parallel_seconds(cost.case_work(run, settings, workers).seconds(timing_entry["seconds"]), gpus)
        return count * cost.job_minutes(len(plan.cases(analysis)) * each) / 60 * gpus

    def experiment_cost_line(self, experiment: str) -> str:
        """What a seed experiment will cost: runs × checkpoints measured, and the time."""
        plan = self.plan
        runs = plan.experiment_runs[experiment]
        checkpoints = sum(len(plan.experiment_checkpoints(run)) for run in runs)
        settings = geometry_settings_from_dict(plan.geometry_settings_dict(experiment))
        run = plan.reference_config(experiment)
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
        plan = self.plan
        open_runs = [
            (e, r)
            for e in plan.seed_experiments
            for r in plan.experiment_runs[e]
            if not Path(f"results/{e}/comparison.csv").exists()
        ]
        count = sum(len(plan.experiment_checkpoints(r)) for _, r in open_runs)
        hours = sum(len(plan.experiment_checkpoints(r)) * self.walltimes.geometry_runtime(e) / 60 for e, r in open_runs)
        return count, hours

    def campaign_line(self, train_minutes: int | None, calibration_minutes: int | None) -> str | None:
        """Under a cluster walltime rule: every GPU-hour the campaign asks Slurm for, training and
        calibration included (None for local runs)."""
        plan = self.plan
        if not (self.cluster.walltime_hours or self.cluster.walltime == "estimate"):
            return None
        untrained = [run for run in plan.run_configs if not Path(f"runs/{run}/trained.json").exists()]
        open_analyses = [a for a in plan.analyses if not Path(f"results/{a}/summary.csv").exists()]
        calibrations = [a for a in open_analyses if self.walltimes.calibration_pending(a)] + [
            e for e in plan.seed_experiments if self.walltimes.geometry_calibration_pending(e)
        ]
        hours = {a: self.requested_hours(a) for a in open_analyses}
        parts, total = [], 0.0
        if untrained:
            each = (train_minutes or 0) / 60
            parts.append(
                f"training {len(untrained)} run(s) × {each:g} h"
                if train_minutes
                else f"training {len(untrained)} run(s) (walltime not set by the profile)"
            )
            total += len(untrained) * each
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
            "settings": settings_record(self.plan.analysis_settings[analysis]),
        }
