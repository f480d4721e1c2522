"""What the workflow computes from its configuration, as plain data: the decisions behind every rule.

:class:`WorkflowPlan` is built once from the workflow's config dict (after schema validation) and
answers the questions the Snakemake rules ask. It checks the configuration and plans each
analysis and seed experiment into a typed, frozen ``plan.campaign``
(:class:`~tiny_llm.campaign.planned.Campaign`), which its parts take and nothing else:

* ``plan.runs`` (:class:`~tiny_llm.campaign.runs.Runs`): the runs trained here (``train_runs``
  plus the runs each seed experiment expands to), the Hugging Face checkpoint lists imported, and
  the caches prepared for them;
* the targets of ``rule all`` (:func:`~tiny_llm.campaign.targets.all_targets` of the campaign);
* ``plan.walltimes`` (:class:`~tiny_llm.campaign.walltimes.Walltimes`): the walltime of each job
  and whether it waits for a calibration, from the campaign's typed cluster settings
  (:class:`~tiny_llm.campaign.plan.ClusterSettings`);
* ``plan.costs`` (:class:`~tiny_llm.campaign.costs.CostReport`): the cost lines printed before a
  run and the campaign record's start events.

The plan itself holds each analysis's checked settings and answers what a rule asks of one
analysis (its run, cases, ranks, memory plan, results). The checks of a configuration are
:mod:`tiny_llm.campaign.checks`; re-attaching to an earlier controller's Slurm jobs is
:mod:`tiny_llm.campaign.slurm_jobs`'. ``workflow/rules/common.smk`` keeps only schema validation
and thin input functions that call these.

Example:
    >>> from tiny_llm.campaign.targets import all_targets
    >>> plan = WorkflowPlan({})
    >>> all_targets(plan.campaign, plan.walltimes)
    []
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tiny_llm.campaign.cbs import expand_cbs_experiments
from tiny_llm.campaign.checks import check_corpus, check_device, check_local_ranks
from tiny_llm.campaign.costs import CostReport
from tiny_llm.campaign.orders import JobOrder, JobSuccessor, OrderPlan, following_state, plan_order, state_step
from tiny_llm.campaign.plan import ClusterSettings
from tiny_llm.campaign.planned import AnalysisPlan, Campaign, ExperimentPlan
from tiny_llm.campaign.preconditioned import (
    Selected,
    imported_states,
    plan_preconditioner,
    trained_states,
)
from tiny_llm.campaign.runs import Runs
from tiny_llm.campaign.studies import plan_seed_studies
from tiny_llm.campaign.walltimes import Walltimes
from tiny_llm.config import RunConfig, load_config
from tiny_llm.curvature.memory import GiB, MemoryPlan
from tiny_llm.data.tokens import TokenCache, offset_plan
from tiny_llm.data.training_order import ORDER_CASES
from tiny_llm.geometry.settings import as_analysis_settings, geometry_settings_from_dict
from tiny_llm.layout import FINAL, IMPORTED, RESOLVED, SPECTRUM_RESULT, STATE_RESULT, epoch_file, epoch_stem
from tiny_llm.workers.binding import check_output_binding, output_binding
from tiny_llm.workers.resolution import memory_plan
from tiny_llm.workers.selection import check_selection
from tiny_llm.workers.settings import (
    AnalysisSettings,
    quadratic_form_engine,
    settings_from_dict,
    sharded_engine,
    spectrum_settings_from_dict,
)

__all__ = ["WorkflowPlan"]


class WorkflowPlan:
    """The workflow's configuration, resolved: runs, caches, analyses, experiments, walltimes.

    Building it checks everything that can be checked before any job (run configurations, seed
    experiments, analysis settings, checkpoint selections, output directory bindings) and raises
    ``ValueError`` naming the config key.
    """

    def __init__(self, config: dict[str, Any]):
        config, self.cbs = expand_cbs_experiments(config)  # their runs and analyses, as any other
        self.analyses: dict[str, Any] = config.get("analyses") or {}
        self.plots: dict[str, Any] = config.get("plots") or {}
        self.seed_experiments: dict[str, Any] = config.get("seed_experiments") or {}
        self.seed_comparisons: dict[str, Any] = config.get("seed_comparisons") or {}
        self.settings_override: dict[str, Any] = config.get("settings_override") or {}
        """Settings a profile imposes on every analysis (profiles/naiss: CUDA, float32, TF32, compiled HVPs)."""
        self.cluster = ClusterSettings.from_dict(config.get("cluster"))
        self.runs = Runs(config, self.analyses, self.seed_experiments)
        for name, entry in self.seed_comparisons.items():
            unknown = sorted(set(entry["experiments"]) - set(self.seed_experiments))
            if unknown:
                raise ValueError(
                    f"seed_comparisons.{name}: {unknown} are not seed_experiments "
                    f"(known: {sorted(self.seed_experiments)})"
                )
        self.seed_studies = plan_seed_studies(config.get("seed_studies") or {}, self.analyses, self.runs)
        self.train_runs, self.experiment_runs = self.runs.train_runs, self.runs.experiment_runs
        self.run_configs, self.imports = self.runs.run_configs, self.runs.imports
        experiment_of = {run: name for name, runs in self.experiment_runs.items() for run in runs}
        for name, run in self.run_configs.items():
            analysed = any(self.trained_here(a) == name and "unseen" in self.cases(a) for a in self.analyses)
            analysed |= any(cbs.base == name for cbs in self.cbs.values())  # its held-out sequences
            where = ("seed_experiments", experiment_of[name]) if name in experiment_of else ("train_runs", name)
            check_corpus(where[1], self.train_runs[name], run, "unseen" if analysed else "train", key=where[0])
        owners = {cbs.base: f"cbs_experiments.{name}" for name, cbs in self.cbs.items()}
        self.runs.check_prepared(owners | {run: f"seed_experiments.{e}" for run, e in experiment_of.items()})
        self.train_device: str = config.get("train_device", "cpu")
        self.orders: dict[str, OrderPlan] = {}
        """The published training orders of analyses of suites trained elsewhere."""
        self.undrawn: set[str] = set()
        """Analyses none of whose selected states has the optimizer's preconditioner."""
        self.analysis_settings = {name: self._check_analysis(name) for name in self.analyses}
        for name in self.analyses:
            gpus, per_node = self.ranks(name)["gpus"], self.cluster.gpus_per_node
            if per_node is not None and gpus > per_node:
                raise ValueError(
                    f"analyses.{name}.gpus_per_job: {gpus} GPUs per node, but a node has {per_node} "
                    "(cluster.gpus_per_node); ask for at most that many, and for more with nodes_per_job"
                )
        self.campaign = Campaign(
            cluster=self.cluster,
            analyses={name: self._planned(name) for name in self.analyses},
            experiments={name: self._planned_experiment(name) for name in self.seed_experiments},
            trained_runs=tuple(self.run_configs),
            comparisons=tuple(self.seed_comparisons),
            cbs=self.cbs,
            studies=tuple(self.seed_studies),
        )
        """What the walltimes, the cost lines and the targets are given."""
        self.walltimes = Walltimes(self.campaign)
        self.costs = CostReport(self.campaign, self.walltimes)

    def _planned(self, name: str) -> AnalysisPlan:
        """An analysis as its campaign's parts see it (a job that cannot fit its memory budget is
        refused here, before any work)."""
        try:
            memory = self.memory(name)
        except ValueError as error:
            raise ValueError(f"analyses.{name}.settings: {error}") from None
        try:
            run = self.run_config(name)
        except (ValueError, OSError):
            run = None
        entry = self.analyses[name]
        pending = name in self.imports and not (Path(entry["run"]) / IMPORTED).exists()
        return AnalysisPlan(
            name=name,
            settings=self.analysis_settings[name],
            run=run,
            run_dir=entry["run"],
            selection=self.selection(name),
            listed=len(entry["hf_checkpoints"]) if pending else None,
            cases=tuple(self.cases(name)),
            ranks=self.job_ranks(name),
            spectrum=spectrum_settings_from_dict(self.analyses[name]["spectrum"])
            if self.spectrum_enabled(name)
            else None,
            preconditioner=self.analysis_settings[name].preconditioned is not False and name not in self.undrawn,
            memory=memory,
            epoch=self.orders[name].epoch if name in self.orders else None,
        )

    def _planned_experiment(self, name: str) -> ExperimentPlan:
        """A seed experiment as its campaign's parts see it."""
        settings = geometry_settings_from_dict(self.geometry_settings_dict(name))
        return ExperimentPlan(
            name=name,
            settings=settings,
            calibration=as_analysis_settings(settings),
            reference=self.reference_config(name),
            checkpoints={run: len(self.experiment_checkpoints(run)) for run in self.experiment_runs[name]},
            walltime_minutes=self.seed_experiments[name].get("walltime_minutes", 60),
        )

    def _check_analysis(self, name: str) -> AnalysisSettings:
        """An analysis's settings, and its output directory checked against them before any work."""
        entry = self.analyses[name]
        settings = settings_from_dict(self.settings_dict(name))
        run = self.trained_here(name)
        writes = None
        if run is not None:
            training = self.run_configs[run].training
            interval = training.checkpoint_policy == "interval"
            writes = {FINAL, *(epoch_file(e) for e in range(training.epochs + 1) if interval)}
        check_selection(f"analyses.{name}.checkpoints", entry["run"], entry.get("checkpoints", "all"), writes)
        if "training_order" in entry:
            self._check_order(name)
        check_output_binding(f"results/{name}", self._binding(name, settings))
        spectrum = entry.get("spectrum") or {}
        if spectrum.get("enabled"):
            try:
                sharded_engine(settings, spectrum_settings_from_dict(spectrum))
            except ValueError as error:
                raise ValueError(f"analyses.{name}.{error}") from None
        if settings.sharded and self.job_ranks(name) == 1:
            raise ValueError(
                f"analyses.{name}.settings.sharded: true shards the model over a job's ranks, but its jobs have one "
                "(gpus_per_job × nodes_per_job); set gpus_per_job to the GPUs to shard over, or sharded: false"
            )
        self._check_offset(name, settings)
        self._check_model(name, settings)
        self._check_preconditioned(name, settings)
        if not settings.trajectory:
            self.runs.notes.append(
                f"analyses.{name}: settings.trajectory is false; step_sharpness and step_loss are not drawn"
            )
        return settings

    def _selected_states(self, name: str) -> list[Selected] | None:
        """The states an analysis of a run trained or imported here selects (None: a run made elsewhere)."""
        run, selection = self.trained_here(name), self.selection(name)
        if run is not None:
            return trained_states(self.run_configs[run], selection)
        if name in self.imports:
            entry, steps = self.runs.import_entries[name], [p.step for p in self.runs.positions[name]]
            return imported_states(entry["hf_checkpoints"], steps, selection, bool(entry.get("adapter")))
        return None

    def _check_preconditioned(self, name: str, settings: AnalysisSettings) -> None:
        """The optimizer's preconditioner of the selected states (:func:`plan_preconditioner`; a run
        made elsewhere: its measurement checks each state)."""
        states, key = self._selected_states(name), f"analyses.{name}.settings.preconditioned"
        if states is not None:
            asked, run_dir = settings.preconditioned, self.analyses[name]["run"]
            if note := plan_preconditioner(key, asked, self.run_config(name), run_dir, states):
                self.undrawn.add(name)
                self.runs.notes.append(f"analyses.{name}: {note}")

    def _check_model(self, name: str, settings: AnalysisSettings) -> None:
        """What the analysis's model cannot do, refused at start-up: an engine it has no rules for
        (an adapter's model with a jet engine), and a case that needs a training order the run does not
        have (seen or unseen of an imported run)."""
        ordered = sorted(set(self.cases(name)) - {"offset"})
        if "step" in ordered and not settings.trajectory:
            raise ValueError(
                f"analyses.{name}.cases: step measures the step to the next checkpoint on its own batches; "
                "it needs settings.trajectory: true"
            )
        if "training_order" not in self.analyses[name] and ((self.imported(name) and ordered) or "recent" in ordered):
            raise ValueError(
                f"analyses.{name}.cases: {', '.join(ordered)} need{'s' if len(ordered) == 1 else ''} the batches "
                "training took, which a run imported from elsewhere does not have unless its training_order is "
                "given; use [offset], or give the suite's published training_order"
            )
        try:
            model = self.run_config(name).model
        except (OSError, ValueError):
            return  # a run not made yet: its training or import checks it
        try:
            quadratic_form_engine(settings, model)
        except ValueError as error:
            where = "settings_override" if "engine" in self.settings_override else f"analyses.{name}.settings"
            raise ValueError(f"{where}.engine: {error}") from None

    def _check_order(self, name: str) -> None:
        """An imported suite's training order, every case's window checked against every analysed
        checkpoint."""
        key = f"analyses.{name}"
        if name not in self.imports:
            raise ValueError(f"{key}.training_order: applies to a suite trained elsewhere (with hf_checkpoints)")
        positions = self.runs.positions[name]
        selection = self.selection(name)
        if selection != "all":
            stems = [epoch_stem(i) for i in range(len(positions))]
            positions = [positions[stems.index(Path(f).stem)] for f in selection if Path(f).stem in stems]
        self.orders[name] = plan_order(
            key, self.analyses[name], self.cases(name), [p.step for p in positions], self.imports[name]
        )

    def case_order(self, job: Any, states: list[dict[str, Any]]) -> JobOrder:
        """What a (state, case) ``job`` (its ``analysis``, ``key`` and ``case``, as the rule's
        wildcards name them) is given of its training order: its window at the state's step among the
        indexed ``states``, the ``step`` case's up to the next state's; None: the case reads the run's
        token cache."""
        plan, case = self.orders.get(job.analysis), job.case
        if plan is None or case not in ORDER_CASES:
            return JobOrder(None)
        state = next(s for s in states if s["key"] == job.key)
        step = state_step(state)
        following = following_state(state, states) if case == "step" else None
        return JobOrder(plan.job(case, step, None if following is None else state_step(following)))

    def successor(self, analysis: str, state: dict[str, Any], states: list[dict[str, Any]]) -> JobSuccessor:
        """The state after an indexed ``state`` among the analysis's ``states`` (by their earliest
        step), whose parameters the trajectory statistics step to; None for the last one, or with
        ``trajectory: false``."""
        following = following_state(state, states)
        if not self.analysis_settings[analysis].trajectory or following is None:
            return JobSuccessor(None)
        alias = min(following["aliases"], key=lambda a: a["step"])
        return JobSuccessor({"key": following["key"], "file": alias["file"], "step": alias["step"]})

    def _check_offset(self, name: str, settings: AnalysisSettings) -> None:
        """An offset epoch that reaches past a cache already prepared is refused at start-up."""
        if "offset" not in self.cases(name):
            return
        try:
            run = self.run_config(name)
            cache = TokenCache(run.data.cache)
        except (ValueError, OSError):
            return  # not there yet: the analysis checks it when it runs
        offset_plan(run, cache, settings.data_offset, key=f"analyses.{name}.settings.data_offset")

    def check_ranks(self, analyses: Iterable[str]) -> None:
        """Ranks of jobs that run on this machine (:func:`check_local_ranks`).

        Raises:
            ValueError: naming the key and what to set instead.
        """
        for name in analyses:
            check_local_ranks(f"analyses.{name}", self.ranks(name), self.analysis_settings[name].device)

    def check_devices(self, train: bool, analyses: Iterable[str]) -> None:
        """For jobs that run on this machine (not on a cluster's nodes): refuse a CUDA device it
        does not have, naming the key (``train_device`` when ``train``ing; ``settings.device`` of
        each of ``analyses``, those this run computes).

        Raises:
            ValueError: naming the key and what to set instead.
        """
        if train:
            check_device("train_device", self.train_device)
        analyses = list(analyses)
        for name in analyses:
            where = "settings_override" if "device" in self.settings_override else f"analyses.{name}.settings"
            check_device(f"{where}.device", self.analysis_settings[name].device)
        self.check_ranks(analyses)

    def memory(self, analysis: str) -> MemoryPlan | None:
        """The memory plan of the analysis's (state, case) jobs under ``memory_budget_gb`` (none
        when unset: on CUDA the budget is then the free memory at run time); None while the run's
        configuration is not there yet.

        Raises:
            ValueError: a pass that does not fit the budget even one sequence at a time.
        """
        settings = self.analysis_settings[analysis]
        try:
            run = self.run_config(analysis)
        except (ValueError, OSError):
            return None
        budget = None if settings.memory_budget_gb is None else int(settings.memory_budget_gb * GiB)
        cuda = settings.device.startswith("cuda")
        return memory_plan(settings, run, budget, cuda=cuda, ranks=self.job_ranks(analysis))

    def trained_here(self, analysis: str) -> str | None:
        """The train_runs name of an analysis's run when this workflow trains it, else None."""
        run = Path(self.analyses[analysis]["run"])
        return run.name if run.parent == Path("runs") and run.name in self.run_configs else None

    def run_ready(self, analysis: str) -> str:
        """The trained run's receipt when the workflow trains it, the import's when it imports it,
        else its resolved.yaml."""
        name = self.trained_here(analysis)
        if name:
            return f"runs/{name}/trained.json"
        run = Path(self.analyses[analysis]["run"])
        return str(run / IMPORTED) if analysis in self.imports else str(run / RESOLVED)

    def calibration_inputs(self, analysis: str) -> list[str]:
        """Calibration needs only the run's shapes: a run trained here is not waited for."""
        return [] if self.trained_here(analysis) else [self.run_ready(analysis)]

    def run_config(self, analysis: str) -> RunConfig:
        name = self.trained_here(analysis)
        if name:
            return self.run_configs[name]
        resolved = Path(self.analyses[analysis]["run"]) / RESOLVED
        return self.imports[analysis] if analysis in self.imports and not resolved.exists() else load_config(resolved)

    def settings_dict(self, analysis: str) -> dict[str, Any]:
        """An analysis's settings as configured; a profile's ``settings_override`` wins."""
        return {**self.analyses[analysis].get("settings", {}), **self.settings_override}

    def binding(self, analysis: str) -> dict[str, Any]:
        return self._binding(analysis, self.analysis_settings[analysis])

    def _binding(self, analysis: str, settings: AnalysisSettings) -> dict[str, Any]:
        """What the analysis's output directory is bound to: its run, settings, spectrum and source,
        and its training order when it has one."""
        entry, order = self.analyses[analysis], self.orders.get(analysis)
        binding = output_binding(settings, entry["run"], entry.get("spectrum", {}))
        return binding | (order.binding() if order is not None else {})

    def cases(self, analysis: str) -> list[str]:
        entry = self.analyses[analysis]
        if "cases" in entry:
            return entry["cases"]
        return ["offset"] if self.imported(analysis) else ["seen", "unseen"]

    def imported(self, analysis: str) -> bool:
        """Whether the analysis's run was trained elsewhere (imported by this workflow or before)."""
        run = Path(self.analyses[analysis]["run"])
        return analysis in self.imports or (run / IMPORTED).exists() and not self.trained_here(analysis)

    def selection(self, analysis: str) -> str | list[str]:
        """The analysis's checkpoints: ``all`` or a list of root checkpoint files."""
        return self.analyses[analysis].get("checkpoints", "all")

    def ranks(self, analysis: str) -> dict[str, int]:
        """How each (state, case) job of an analysis runs: ``gpus`` processes per node (GPUs on the
        cluster, CPU processes locally) on ``nodes`` nodes."""
        entry = self.analyses[analysis]
        return {"gpus": int(entry.get("gpus_per_job", 1)), "nodes": int(entry.get("nodes_per_job", 1))}

    def job_ranks(self, analysis: str) -> int:
        """Ranks of one (state, case) job: ``gpus_per_job`` on each of ``nodes_per_job`` nodes."""
        ranks = self.ranks(analysis)
        return ranks["gpus"] * ranks["nodes"]

    def gpus_requested(self, analysis: str) -> int:
        """GPUs one (state, case) job holds: every rank's, over its nodes (none on a CPU device)."""
        return 0 if self.analysis_settings[analysis].device == "cpu" else self.job_ranks(analysis)

    def spectrum_enabled(self, analysis: str) -> bool:
        return bool(self.analyses[analysis].get("spectrum", {}).get("enabled", False))

    def state_checkpoint(self, analysis: str, state: dict[str, Any]) -> str:
        """The state's first alias: the file the worker measures (the others are identical). The
        index holds names relative to the run, so a moved or copied project still finds them."""
        return str(Path(self.analyses[analysis]["run"]) / state["aliases"][0]["file"])

    def state_results(self, analysis: str, key: str) -> list[str]:
        """Every result of one state: noise statistics, and spectra when enabled (one group job)."""
        patterns = [STATE_RESULT] + ([SPECTRUM_RESULT] if self.spectrum_enabled(analysis) else [])
        return [p.format(analysis=analysis, key=key, case=case) for p in patterns for case in self.cases(analysis)]

    # --- seed experiments -------------------------------------------------------------------

    def experiment_checkpoints(self, run: str) -> list[str]:
        """The checkpoints of a run of an experiment: trained here, the interval checkpoints epoch-000
        (initialisation) to the last epoch; imported, one per checkpoint directory, in their order."""
        if run in self.run_configs:
            return [epoch_stem(i) for i in range(self.run_configs[run].training.epochs + 1)]
        return [epoch_stem(i) for i in range(len(self.runs.import_entries[self.runs.importing(run)]["hf_checkpoints"]))]

    def reference_config(self, experiment: str) -> RunConfig:
        """The run configuration of an experiment's first run (its reference set's data and batch)."""
        return self.runs.run_config(self.reference_run(experiment))

    def experiment_records(self, experiment: str) -> list[str]:
        return [
            f"results/{experiment}/geometry/{run}/{checkpoint}.json"
            for run in self.experiment_runs[experiment]
            for checkpoint in self.experiment_checkpoints(run)
        ]

    def reference_run(self, experiment: str) -> str:
        return next(iter(self.experiment_runs[experiment]))

    def geometry_settings_dict(self, experiment: str) -> dict[str, Any]:
        """The experiment's measurement settings; a profile's device and dtype win (as for analyses)."""
        imposed = {key: self.settings_override[key] for key in ("device", "dtype") if key in self.settings_override}
        return {**self.seed_experiments[experiment].get("settings", {}), **imposed}

    def calibration_settings(self, experiment: str) -> AnalysisSettings:
        """The analysis setup whose timing entry prices the experiment's measurements."""
        return as_analysis_settings(geometry_settings_from_dict(self.geometry_settings_dict(experiment)))

    # --- walltimes and calibration ------------------------------------------------------------

    # --- before a run ---------------------------------------------------------------------------
