# Configuration checks and the named input functions shared by every rule. The decisions behind
# them (runs, caches, targets, walltimes, calibration order, re-attach) are plain functions of
# tiny_llm.campaign.workflow, unit-tested without Snakemake; here they are only called.
import json
import sys
from dataclasses import asdict
from pathlib import Path

from snakemake.utils import validate

from tiny_llm.campaign import jobs, packing, slurm_jobs
from tiny_llm.campaign.checks import (
    order_keys_without_order,
    schema_errors,
    typed_profile_values,
    unknown_keys,
)
from tiny_llm.campaign.targets import all_targets, experiment_targets
from tiny_llm.campaign.workflow import WorkflowPlan
from tiny_llm.config import config_to_dict, parse_yaml
from tiny_llm.io import read_if_changed
from tiny_llm.provenance import source_hash
from tiny_llm.layout import FIGURE_RULES
from tiny_llm.results.record import append_event
from tiny_llm.workers.settings import CASES

_SCHEMA = parse_yaml(
    (Path(workflow.basedir) / "workflow/schemas/config.schema.yaml").read_text()
)


# Unknown keys and bad values as one line naming the key, rather than the validator's dump of the
# whole schema; profile values arrive as strings and are typed first.
typed_profile_values(config)
for _problems in (
    unknown_keys(config, _SCHEMA),
    schema_errors(config, _SCHEMA),
    order_keys_without_order(config),
):
    if _problems:
        jobs.refuse(_problems[0])
validate(config, schema="../schemas/config.schema.yaml")  # fills in the defaults

# Every check that needs no job, before any job.
with jobs.refusing():
    PLAN = WorkflowPlan(config)
ANALYSES = PLAN.analyses
PLOTS = PLAN.plots
SEED_EXPERIMENTS = PLAN.seed_experiments
SEED_COMPARISONS = PLAN.seed_comparisons
CLUSTER = PLAN.cluster
# Earlier controllers' Slurm jobs: the await_* rules stand in for the results they still compute.
EARLIER = slurm_jobs.Reattachment(workflow, ANALYSES)

# The controller: Slurm states, Ctrl-C, the frozen source; a cluster job: its devices one case at a time.
jobs.set_up_process(workflow, CLUSTER.on_interrupt)


wildcard_constraints:
    # runs trained here, and imported ones (measured by seed experiments; train_run is never asked for them)
    run="|".join([*PLAN.run_configs, *PLAN.runs.imported_runs]) or "NONE",
    imported="|".join(PLAN.runs.imported_runs) or "NONE",
    cache="|".join(PLAN.runs.caches) or "NONE",
    analysis="|".join(ANALYSES) or "NONE",
    experiment="|".join(SEED_EXPERIMENTS) or "NONE",
    comparison="|".join(SEED_COMPARISONS) or "NONE",
    checkpoint="epoch-[0-9]{3}",
    key="[0-9a-f]{64}",
    case="|".join(CASES),


def _by(wildcard, answer):
    """An input function: ``answer`` of the job's ``wildcard`` value."""
    return lambda wildcards: answer(getattr(wildcards, wildcard))


def get_all_targets(wildcards):
    return all_targets(PLAN.campaign, PLAN.walltimes)


# --- data and training -------------------------------------------------------------------

get_cache_spec = _by("cache", PLAN.runs.cache_spec)
get_cache_inputs = _by("cache", PLAN.runs.cache_inputs)
get_cache_receipt = _by("run", PLAN.runs.cache_receipt)
get_run_config_dict = _by("run", lambda run: config_to_dict(PLAN.run_configs[run]))

# --- analyses ------------------------------------------------------------------------------

get_run_ready = _by("analysis", PLAN.run_ready)
get_calibration_inputs = _by("analysis", PLAN.calibration_inputs)
get_calibration = _by("analysis", PLAN.walltimes.calibration)
get_analysis_run_config = _by("analysis", lambda a: config_to_dict(PLAN.run_config(a)))
get_analysis_run = _by("analysis", lambda analysis: ANALYSES[analysis]["run"])
get_analysis_selection = _by("analysis", PLAN.selection)
get_analysis_settings = _by("analysis", PLAN.settings_dict)
get_analysis_cases = _by("analysis", PLAN.cases)
get_import_spec = _by("imported", PLAN.runs.import_spec)
get_import_inputs = _by("imported", PLAN.runs.import_inputs)
get_analysis_binding = _by("analysis", PLAN.binding)
get_spectrum_settings = _by("analysis", lambda a: ANALYSES[a].get("spectrum", {}))
get_analyze_runtime = _by("analysis", PLAN.walltimes.analyze_runtime)
get_gpus = _by("analysis", PLAN.gpus_requested)  # every rank's GPU, over its nodes
get_nodes = _by("analysis", lambda analysis: PLAN.ranks(analysis)["nodes"])
get_ranks = _by("analysis", lambda analysis: PLAN.ranks(analysis)["gpus"])  # a node's
# Slurm tasks of a CPU job: one per node (the plugin asks --ntasks=1 otherwise, which Slurm meets
# with one node); a GPU job's tasks follow its GPUs (0: the plugin adds nothing).
get_tasks = _by(
    "analysis",
    lambda analysis: (
        0 if PLAN.gpus_requested(analysis) else PLAN.ranks(analysis)["nodes"]
    ),
)
get_finish_runtime = _by("analysis", PLAN.walltimes.finish_runtime)
get_attempt = lambda wildcards, attempt: attempt  # 1 + retries so far, in each result


# analysis -> states.json (a checkpoint's output, once created, stays created)
_INDEXED = {}


def _states(analysis):  # states.json, once its index checkpoint has run
    if analysis not in _INDEXED:
        index = checkpoints.index_states.get(analysis=analysis)
        _INDEXED[analysis] = index.output.states
    return read_if_changed(_INDEXED[analysis], _Indexed)


class _Indexed(list):  # the states in their order, each also found by its key
    def __init__(self, text):
        super().__init__(json.loads(text)["states"])
        self.by_key = {state["key"]: state for state in self}


def _state(wildcards):
    state = _states(wildcards.analysis).by_key.get(wildcards.key)
    if state is None:
        raise ValueError(
            f"state {wildcards.key} is not indexed in {wildcards.analysis}"
        )
    return state


def get_state_aliases(wildcards):
    """Every file of the state: the worker checks they are identical and records them all."""
    return [alias["file"] for alias in _state(wildcards)["aliases"]]


get_state_checkpoint = lambda w: PLAN.state_checkpoint(w.analysis, _state(w))
get_state_results = lambda w: PLAN.state_results(w.analysis, w.key)
get_case_order = lambda w: PLAN.case_order(w, _states(w.analysis))  # its window
get_successor = lambda w: PLAN.successor(w.analysis, _state(w), _states(w.analysis))
get_state_group = lambda w: packing.analysis_group(workflow, PLAN, w.analysis)


def get_state_receipts(wildcards):
    return [
        f"results/{wildcards.analysis}/states/{state['key']}/done.json"
        for state in _states(wildcards.analysis)
    ]


def get_training_log(wildcards):
    """With training norms, the run must be finished (its train-log.jsonl is read by the plot)."""
    return [get_run_ready(wildcards)] if PLOTS.get("training_norms") else []


def figure_reports(figures):
    """Named PDF outputs, each a report entry with its caption (workflow/report/figures/)."""
    return {
        figure: report(
            f"results/{{analysis}}/figures/{figure}.pdf",
            caption=f"../report/figures/{figure}.rst",
            category="Figures",
            subcategory="{analysis}",
        )
        for figure in figures
    }


# --- seed experiments --------------------------------------------------------------------


def get_experiment_records(wildcards):
    """Every checkpoint record of the experiment. While a calibration is pending they are planned
    only once the reference set exists (it waits for the calibration), so that the measurement
    jobs get measured walltimes; otherwise at once (a dry run shows every measurement).
    """
    if PLAN.walltimes.geometry_calibration_pending(wildcards.experiment):
        checkpoints.geometry_reference.get(experiment=wildcards.experiment)
    return PLAN.experiment_records(wildcards.experiment)


get_experiment_roles = _by("experiment", PLAN.experiment_runs.get)
# trained.json, or an imported run's imported.json
get_run_receipt = _by("run", PLAN.runs.receipt)
get_reference_cache = _by(
    "experiment", lambda e: PLAN.runs.cache_receipt(PLAN.reference_run(e))
)
get_reference_run_config = _by(
    "experiment", lambda e: config_to_dict(PLAN.reference_config(e))
)
get_geometry_settings = _by("experiment", PLAN.geometry_settings_dict)
get_geometry_calibration = _by("experiment", PLAN.walltimes.geometry_calibration)
get_geometry_runtime = _by("experiment", PLAN.walltimes.geometry_runtime)
get_geometry_calibration_settings = _by(
    "experiment", lambda e: asdict(PLAN.calibration_settings(e))
)
get_compared_experiments = _by(
    "comparison",
    lambda c: expand(
        "results/{experiment}/comparison.csv",
        experiment=SEED_COMPARISONS[c]["experiments"],
    ),
)
get_comparison_entry = _by("comparison", SEED_COMPARISONS.get)


onstart:
    # Jobs that run here need the devices they name (the executor is known only now).
    if workflow.local_exec:
        with jobs.refusing():
            PLAN.check_devices(*jobs.uses_devices(workflow.dag))
    EARLIER.reattach(workflow.dag, CLUSTER.reattach_poll_seconds)
    # The campaign record: one start event per analysis and controller run (not in dry runs).
    for _name in ANALYSES:
        append_event(
            f"results/{_name}",
            PLAN.costs.start_event(_name, sys.argv, source_hash()),
        )


onerror:
    # Last, one line per failed job (tracebacks stay in the jobs' logs).
    jobs.print_failed_jobs(log)


if workflow.is_main_process:
    jobs.print_cost_lines(PLAN, workflow)
