# Configuration checks and named input functions shared by every rule.
import functools
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

from snakemake.utils import validate

from tiny_llm.analysis import check_output_binding, output_binding, settings_from_dict
from tiny_llm import campaign, plan, slurm_jobs, timing
from tiny_llm.config import (
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    load_config_dict,
    parse_yaml,
)
from tiny_llm.corpus import default_capacity
from tiny_llm.geometry_analysis import (
    as_analysis_settings,
    geometry_settings_from_dict,
    measurement_seconds,
)
from tiny_llm.plots import FIGURES, SPECTRUM_FIGURES
from tiny_llm.provenance import source_hash, use_frozen_source
from tiny_llm.slurm_states import (
    keep_running_jobs_on_interrupt,
    normalise_plugin_states,
)
from tiny_llm.states import check_selection

_SCHEMA = parse_yaml(
    (Path(workflow.basedir) / "workflow/schemas/config.schema.yaml").read_text()
)
_unknown = sorted(set(config) - set(_SCHEMA["properties"]))
if _unknown:  # one line, rather than the validator's dump of the whole schema
    raise ValueError(
        f"unknown configuration keys {_unknown}; allowed: {sorted(_SCHEMA['properties'])}"
    )


def _typed(value):
    """Profile `config:` values arrive as strings ('True', '64'): read them as YAML scalars."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    return parse_yaml(value) if isinstance(value, str) else value


for _key in (
    "settings_override",
    "cluster",
):  # typed before validation (cluster.walltime_hours: '12')
    if isinstance(config.get(_key), dict):
        config[_key] = _typed(config[_key])
validate(config, schema="../schemas/config.schema.yaml")

TRAIN_RUNS = dict(config.get("train_runs") or {})
ANALYSES = config.get("analyses") or {}
PLOTS = config.get("plots") or {}
SEED_EXPERIMENTS = config.get("seed_experiments") or {}
SEED_COMPARISONS = config.get("seed_comparisons") or {}


# Settings a profile imposes on every analysis (profiles/naiss: CUDA, float32, TF32, compiled HVPs).
SETTINGS_OVERRIDE = config.get("settings_override") or {}
CLUSTER = config.get("cluster") or {}


# --- the controller: its frozen source, and the Slurm jobs of earlier controllers ---------

# Outputs of the rules a local job can stand in for while an earlier controller's job computes them.
_AWAITABLE = {
    "analyze_state": "results/{analysis}/states/{key}/{case}.json",
    "finish_state": "results/{analysis}/states/{key}/done.json",
    "analyze_spectrum": "results/{analysis}/spectra/{key}/{case}.json",
}
_STANDS_IN = {
    "await_result": "analyze_state",
    "await_receipt": "finish_state",
    "await_spectrum": "analyze_spectrum",
}
NOT_AWAITED = ".snakemake/tiny-llm/no earlier Slurm job writes this"  # made by no rule

if workflow.is_main_process:
    # The plugin's view of Slurm states and of Ctrl-C: see tiny_llm.slurm_states.
    normalise_plugin_states()
    keep_running_jobs_on_interrupt(CLUSTER.get("on_interrupt", "keep-running"))
    # Every job of this run, Slurm jobs starting hours later included, imports this copy of
    # tiny_llm: editing the checkout meanwhile neither changes nor blocks them.
    use_frozen_source(".snakemake/tiny-llm-source")


@functools.cache
def earlier_jobs():
    """Active Slurm jobs of earlier controllers in this directory. Looked up once, while the DAG
    is built, and only by a run that submits to Slurm (not a dry run, not a local run).
    """
    if not workflow.is_main_process or workflow.local_exec or workflow.dryrun:
        return []
    jobs, warnings = slurm_jobs.earlier_jobs(Path.cwd())
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return jobs


@functools.cache
def awaited_outputs():
    """Output -> id of the running Slurm job of an earlier controller that writes it."""
    awaited = {}
    for job in earlier_jobs():
        targets = [(name, dict(wildcards)) for name, wildcards in job.targets]
        if not job.queued and all(
            name in _AWAITABLE and wildcards.get("analysis") in ANALYSES
            for name, wildcards in targets
        ):
            for name, wildcards in targets:
                awaited[_AWAITABLE[name].format(**wildcards)] = job.job_id
    return awaited


def _awaited(wildcards, stage, name):
    return (
        f"results/{wildcards.analysis}/{stage}/{wildcards.key}/{name}.json"
        in awaited_outputs()
    )


def _when_awaited(stage, function, name=None):
    """The stood-in rule's input when an earlier job writes this output, else a file that no
    rule makes (so that the ordinary rule applies)."""

    def inputs(wildcards):
        if _awaited(wildcards, stage, name or wildcards.case):
            return function(wildcards)
        return NOT_AWAITED

    return inputs


def _earlier_job(stage, name=None):
    def job(wildcards):
        case = name or wildcards.case
        return awaited_outputs().get(
            f"results/{wildcards.analysis}/{stage}/{wildcards.key}/{case}.json", ""
        )

    return job


def _earlier_jobs_of_this_run(dag):
    """The earlier controllers' jobs that compute something this run needs, by what to do:
    (queued jobs to cancel, running jobs awaited by a local job, running jobs to wait for first).
    """
    needed = {
        (
            _STANDS_IN.get(job.rule.name, job.rule.name),
            tuple(sorted(job.wildcards_dict.items())),
        )
        for job in dag.needrun_jobs()
    }
    queued, awaited, first = [], [], []
    for job in earlier_jobs():
        if not any(target in needed for target in job.targets):
            continue  # another controller's work (or already finished): left alone
        if job.queued:
            queued.append(job.job_id)
        elif job.job_id in awaited_outputs().values():
            awaited.append(job.job_id)
        else:
            first.append(job.job_id)
    return queued, awaited, first


def reattach(dag, poll_seconds):
    """At the start of a run: cancel the earlier controllers' queued jobs (their work is submitted
    again now), report the running ones that are awaited, and wait for running jobs of other
    rules (training, data, calibration), whose work a new job would otherwise repeat."""
    queued, awaited, first = _earlier_jobs_of_this_run(dag)
    if queued:
        slurm_jobs.cancel(queued)
        print(
            f"Cancelled {len(queued)} queued Slurm job(s) of an earlier controller "
            f"({' '.join(queued)}); their work is submitted again by this run.",
            file=sys.stderr,
        )
    if awaited:
        print(
            f"Re-attached to {len(awaited)} running Slurm job(s) of an earlier controller "
            f"({' '.join(awaited)}): their results are awaited (rules await_*), not computed again.",
            file=sys.stderr,
        )
    for job_id in first:
        print(
            f"Waiting for Slurm job {job_id} of an earlier controller (training, data or "
            "calibration) before submitting anything that would repeat its work...",
            file=sys.stderr,
        )
        slurm_jobs.wait_for_job(
            job_id,
            [],
            poll_seconds=poll_seconds,
            log=lambda line: print(line, file=sys.stderr),
        )


def _load_run_config(name):
    """A run the workflow trains is meant for analysis: unless its configuration says otherwise,
    it writes interval checkpoints (one state per virtual epoch, not just the final one).
    """
    entry = TRAIN_RUNS[name]
    data = load_config_dict(entry["config"])
    overrides = [f"{key}={value}" for key, value in entry.get("set", {}).items()]
    if "checkpoint_policy" not in (data.get("training") or {}):
        overrides.insert(0, "training.checkpoint_policy=interval")
    return config_from_dict(apply_overrides(data, overrides))


# Each seed experiment trains its runs like train_runs: <experiment>-seed-<s> per seed, and the
# controls <experiment>-same-seed (the first seed again) and <experiment>-data-order (the first
# seed, data.seed + 1). Every run writes interval checkpoints; they share one token cache.
EXPERIMENT_RUNS = {}  # experiment -> {run name: role}
for _exp, _entry in SEED_EXPERIMENTS.items():
    if _exp in ANALYSES:
        raise ValueError(
            f"seed_experiments.{_exp}: an analysis has the same name (both write results/{_exp}/); rename one"
        )
    _base = {
        key: _entry[key]
        for key in ("config", "cache_source", "cache_inputs", "shard_tokens")
        if key in _entry
    }
    _set = {**_entry.get("set", {}), "training.checkpoint_policy": "interval"}
    _data_seed = config_from_dict(
        apply_overrides(
            load_config_dict(_entry["config"]),
            [f"{key}={value}" for key, value in _set.items()],
        )
    ).data.seed
    _first = _entry["seeds"][0]
    _runs = {
        f"{_exp}-seed-{seed}": ("seed", {"training.seed": seed})
        for seed in _entry["seeds"]
    }
    _controls = _entry.get("controls", ["same-seed", "data-order"])
    if "same-seed" in _controls:
        _runs[f"{_exp}-same-seed"] = ("same-seed", {"training.seed": _first})
    if "data-order" in _controls:
        _runs[f"{_exp}-data-order"] = (
            "data-order",
            {"training.seed": _first, "data.seed": _data_seed + 1},
        )
    for _name, (_role, _overrides) in _runs.items():
        if _name in TRAIN_RUNS:
            raise ValueError(
                f"seed_experiments.{_exp} trains runs/{_name}, which train_runs also names; rename one"
            )
        TRAIN_RUNS[_name] = {**_base, "set": {**_set, **_overrides}}
    EXPERIMENT_RUNS[_exp] = {name: role for name, (role, _) in _runs.items()}
    try:
        geometry_settings_from_dict(_entry.get("settings"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"seed_experiments.{_exp}.settings: {error}") from None
for _name, _entry in SEED_COMPARISONS.items():
    _unknown = sorted(set(_entry["experiments"]) - set(SEED_EXPERIMENTS))
    if _unknown:
        raise ValueError(
            f"seed_comparisons.{_name}: {_unknown} are not seed_experiments (known: {sorted(SEED_EXPERIMENTS)})"
        )

RUN_CONFIGS = {name: _load_run_config(name) for name in TRAIN_RUNS}
CACHE_OF_RUN = {}
for _name, _run in RUN_CONFIGS.items():
    _cache = Path(_run.data.cache)
    if _cache.parent != Path("cache"):
        raise ValueError(
            f"train_runs.{_name}: data.cache must be cache/<name> for the workflow to prepare it, got {_cache}"
        )
    CACHE_OF_RUN[_name] = _cache.name
RUN_OF_CACHE = {}
for _name, _cache in CACHE_OF_RUN.items():
    RUN_OF_CACHE.setdefault(_cache, _name)

# Each analysis: its settings, and its output directory checked against them before any work.
ANALYSIS_SETTINGS = {}
for _name, _entry in ANALYSES.items():
    ANALYSIS_SETTINGS[_name] = settings_from_dict(
        {**_entry.get("settings", {}), **SETTINGS_OVERRIDE}
    )
    check_selection(
        f"analyses.{_name}.checkpoints",
        _entry["run"],
        _entry.get("checkpoints", "all"),
        trained_here=Path(_entry["run"]).parent == Path("runs")
        and Path(_entry["run"]).name in RUN_CONFIGS,
    )
    check_output_binding(
        f"results/{_name}",
        output_binding(
            ANALYSIS_SETTINGS[_name], _entry["run"], _entry.get("spectrum", {})
        ),
    )


wildcard_constraints:
    run="|".join(RUN_CONFIGS) or "NONE",
    cache="|".join(RUN_OF_CACHE) or "NONE",
    analysis="|".join(ANALYSES) or "NONE",
    experiment="|".join(SEED_EXPERIMENTS) or "NONE",
    comparison="|".join(SEED_COMPARISONS) or "NONE",
    checkpoint="epoch-[0-9]{3}",
    key="[0-9a-f]{64}",
    case="seen|unseen",


def get_all_targets(wildcards):
    """Every run and figure, and every (state, case) result of an existing index.

    Naming the results makes a deleted result count as missing (Snakemake does not rerun a
    deleted intermediate file whose consumers are up to date), so a rerun recomputes exactly
    what was lost. The index is read directly when present (before the first run the figures
    pull in every result through collect), which keeps the first dry run's plan complete.
    """
    targets = [f"runs/{name}/trained.json" for name in RUN_CONFIGS]
    targets += experiment_targets()
    for name in ANALYSES:
        # The collected files too: a crash during collect (or their deletion) reruns collect.
        targets += [f"results/{name}/manifest.json", f"results/{name}/summary.csv"]
        targets += [f"results/{name}/spectrum.csv"] if spectrum_enabled(name) else []
        # A walltime waiting for a calibration: the short calibration job starts at once.
        if calibration_pending(name):
            targets.append(f"results/timing/{name}.json")
        targets += [
            f"results/{name}/figures/{figure}.{ext}"
            for figure in FIGURES
            for ext in ("pdf", "png")
        ]
        if spectrum_enabled(name):
            targets += [
                f"results/{name}/figures/{figure}.{ext}"
                for figure in SPECTRUM_FIGURES
                for ext in ("pdf", "png")
            ]
        index = Path(f"results/{name}/states.json")
        if index.exists() and not calibration_pending(name):
            targets += [
                f"results/{name}/states/{state['key']}/{case}.json"
                for state in json.loads(index.read_text())["states"]
                for case in get_cases(name)
            ]
    return targets


# --- data and training -------------------------------------------------------------------


def get_cache_receipt(wildcards):
    return f"cache/{CACHE_OF_RUN[wildcards.run]}.prepared.json"


def get_run_config_dict(wildcards):
    return config_to_dict(RUN_CONFIGS[wildcards.run])


def get_cache_spec(wildcards):
    """Everything that determines a cache's contents (a change reruns prepare_data)."""
    name = RUN_OF_CACHE[wildcards.cache]
    entry = TRAIN_RUNS[name]
    source = entry.get("cache_source", "demo")
    return {
        "cache_source": source,
        "cache_inputs": entry.get("cache_inputs", []),
        "shard_tokens": entry.get("shard_tokens", 1 << 20),
        "data": config_to_dict(RUN_CONFIGS[name].data),
        "capacity": default_capacity(RUN_CONFIGS[name]) if source == "demo" else None,
    }


def get_cache_inputs(wildcards):
    return TRAIN_RUNS[RUN_OF_CACHE[wildcards.cache]].get("cache_inputs", [])


# --- analysis ----------------------------------------------------------------------------


def _trained_here(analysis):
    """The train_runs name of an analysis's run when this workflow trains it, else None."""
    run = Path(ANALYSES[analysis]["run"])
    return run.name if run.parent == Path("runs") and run.name in RUN_CONFIGS else None


def get_run_ready(wildcards):
    """The trained run's receipt when the workflow trains it, else its resolved.yaml."""
    name = _trained_here(wildcards.analysis)
    if name:
        return f"runs/{name}/trained.json"
    return str(Path(ANALYSES[wildcards.analysis]["run"]) / "resolved.yaml")


def get_calibration_inputs(wildcards):
    """Calibration needs only the run's shapes: a run trained here is not waited for."""
    if _trained_here(wildcards.analysis):
        return []
    return [str(Path(ANALYSES[wildcards.analysis]["run"]) / "resolved.yaml")]


def get_analysis_run_config(wildcards):
    return config_to_dict(_analysis_run_config(wildcards.analysis))


def get_analysis_run(wildcards):
    return ANALYSES[wildcards.analysis]["run"]


def get_analysis_selection(wildcards):
    return ANALYSES[wildcards.analysis].get("checkpoints", "all")


def get_analysis_settings(wildcards):
    return {**ANALYSES[wildcards.analysis].get("settings", {}), **SETTINGS_OVERRIDE}


def get_analysis_binding(wildcards):
    entry = ANALYSES[wildcards.analysis]
    return output_binding(
        ANALYSIS_SETTINGS[wildcards.analysis], entry["run"], entry.get("spectrum", {})
    )


def get_cases(analysis):
    return ANALYSES[analysis].get("cases", ["seen", "unseen"])


def _states(analysis):
    """states.json of an analysis (after its index checkpoint has run)."""
    path = checkpoints.index_states.get(analysis=analysis).output.states
    return json.loads(Path(path).read_text())


def _state(wildcards):
    for state in _states(wildcards.analysis)["states"]:
        if state["key"] == wildcards.key:
            return state
    raise ValueError(
        f"state {wildcards.key} is not in the index of {wildcards.analysis}"
    )


def get_state_checkpoint(wildcards):
    """The state's first alias: the file the worker measures (the others are identical). The index
    holds names relative to the run, so a moved or copied project still finds them."""
    run = Path(ANALYSES[wildcards.analysis]["run"])
    return str(run / _state(wildcards)["aliases"][0]["file"])


def spectrum_enabled(analysis):
    return bool(ANALYSES[analysis].get("spectrum", {}).get("enabled", False))


def get_spectrum_settings(wildcards):
    return ANALYSES[wildcards.analysis].get("spectrum", {})


def get_state_results(wildcards):
    """Every result of one state: noise statistics, and spectra when enabled (one group job)."""
    kinds = ["states"] + (["spectra"] if spectrum_enabled(wildcards.analysis) else [])
    return [
        f"results/{wildcards.analysis}/{kind}/{wildcards.key}/{case}.json"
        for kind in kinds
        for case in get_cases(wildcards.analysis)
    ]


def get_state_receipts(wildcards):
    return [
        f"results/{wildcards.analysis}/states/{state['key']}/done.json"
        for state in _states(wildcards.analysis)["states"]
    ]


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


def get_training_log(wildcards):
    """With training norms, the run must be finished (its train-log.jsonl is read by the plot)."""
    if not PLOTS.get("training_norms", False):
        return []
    return [get_run_ready(wildcards)]


# --- seed experiments --------------------------------------------------------------------


def experiment_checkpoints(run):
    """The interval checkpoints a run of an experiment writes: epoch-000 (initialisation) to the last epoch."""
    return [f"epoch-{i:03d}" for i in range(RUN_CONFIGS[run].training.epochs + 1)]


def get_experiment_records(wildcards):
    """Every checkpoint record of the experiment. While a calibration is pending they are planned
    only once the reference set exists (it waits for the calibration), so that the measurement
    jobs get measured walltimes; otherwise at once (a dry run shows every measurement).
    """
    if geometry_calibration_pending(wildcards.experiment):
        checkpoints.geometry_reference.get(experiment=wildcards.experiment)
    return [
        f"results/{wildcards.experiment}/geometry/{run}/{checkpoint}.json"
        for run in EXPERIMENT_RUNS[wildcards.experiment]
        for checkpoint in experiment_checkpoints(run)
    ]


def get_experiment_roles(wildcards):
    return EXPERIMENT_RUNS[wildcards.experiment]


def _reference_run(experiment):
    return next(iter(EXPERIMENT_RUNS[experiment]))


def get_reference_cache(wildcards):
    return f"cache/{CACHE_OF_RUN[_reference_run(wildcards.experiment)]}.prepared.json"


def get_reference_run_config(wildcards):
    return config_to_dict(RUN_CONFIGS[_reference_run(wildcards.experiment)])


def _geometry_settings_dict(experiment):
    """The experiment's measurement settings; a profile's device and dtype win (as for analyses)."""
    imposed = {
        key: SETTINGS_OVERRIDE[key]
        for key in ("device", "dtype")
        if key in SETTINGS_OVERRIDE
    }
    return {**SEED_EXPERIMENTS[experiment].get("settings", {}), **imposed}


def get_geometry_settings(wildcards):
    return _geometry_settings_dict(wildcards.experiment)


def _geometry_settings(experiment):
    return geometry_settings_from_dict(_geometry_settings_dict(experiment))


def _geometry_timing_entry(experiment):
    """The timing entry of an experiment's measurement setup (cluster.gpu_kind), or None."""
    run_config = RUN_CONFIGS[_reference_run(experiment)]
    key = timing.timing_key(
        run_config, as_analysis_settings(_geometry_settings(experiment)), device_kind=""
    )
    entries = timing.load_profiles(CLUSTER["timing_profiles"])
    return timing.lookup_entry(entries, key, CLUSTER.get("gpu_kind"))


_GEOMETRY_CALIBRATION_PENDING = {}


def geometry_calibration_pending(experiment):
    """Whether an experiment's measurement walltimes wait for its calibration job: walltimes are
    estimated and no timing entry covers the measurement setup yet."""
    if experiment not in _GEOMETRY_CALIBRATION_PENDING:
        pending = False
        if CLUSTER.get("walltime") == "estimate" and not CLUSTER.get("walltime_hours"):
            pending = _geometry_timing_entry(experiment) is None
        _GEOMETRY_CALIBRATION_PENDING[experiment] = pending
    return _GEOMETRY_CALIBRATION_PENDING[experiment]


def get_geometry_calibration(wildcards):
    if geometry_calibration_pending(wildcards.experiment):
        return [f"results/timing/{wildcards.experiment}.json"]
    return []


def get_geometry_runtime(wildcards):
    """Minutes for one checkpoint's measurement: cluster.walltime_hours when set; under
    cluster.walltime: estimate, 2 x estimated work + 30 min rounded up to the hour from the timing
    entry of the setup (measured first by calibrate_geometry when there is none: the measurement
    jobs are planned after it); else the experiment's walltime_minutes.
    """
    experiment = wildcards.experiment
    if CLUSTER.get("walltime_hours"):
        return int(CLUSTER["walltime_hours"] * 60)
    if CLUSTER.get("walltime") == "estimate":
        entry = _geometry_timing_entry(experiment)
        if entry is not None:
            return timing.job_minutes(
                measurement_seconds(
                    RUN_CONFIGS[_reference_run(experiment)],
                    _geometry_settings(experiment),
                    entry["seconds"],
                )
            )
    return SEED_EXPERIMENTS[experiment].get("walltime_minutes", 60)


def get_geometry_calibration_settings(wildcards):
    return asdict(as_analysis_settings(_geometry_settings(wildcards.experiment)))


def experiment_targets():
    """comparison.csv and the dashboard of every experiment, and every comparison's figure."""
    targets = []
    for name in SEED_EXPERIMENTS:
        targets += [f"results/{name}/comparison.csv"]
        # A walltime waiting for a calibration: the short calibration job starts at once.
        if geometry_calibration_pending(name):
            targets.append(f"results/timing/{name}.json")
        targets += [f"results/{name}/figures/dashboard.{ext}" for ext in ("pdf", "png")]
    for name in SEED_COMPARISONS:
        targets += [
            f"results/comparisons/{name}/comparison.{ext}" for ext in ("pdf", "png")
        ]
    return targets


# --- cluster walltime --------------------------------------------------------------------


def _analysis_run_config(analysis):
    name = _trained_here(analysis)
    if name:
        return RUN_CONFIGS[name]
    return load_config(Path(ANALYSES[analysis]["run"]) / "resolved.yaml")


def _timing_entry(analysis, device_kind):
    """The timing entry measured for an analysis's setup on a device whose kind contains
    ``device_kind`` (any when None), from cluster.timing_profiles; None when there is none.
    """
    key = timing.timing_key(
        _analysis_run_config(analysis), ANALYSIS_SETTINGS[analysis], device_kind=""
    )
    entries = timing.load_profiles(CLUSTER["timing_profiles"])
    return timing.lookup_entry(entries, key, device_kind)


def _case_work_seconds(analysis):
    """Estimated work of one (state, case) job from the timing profiles, or None (no estimate)."""
    if CLUSTER.get("walltime", "none") != "estimate":
        return None
    run_config = _analysis_run_config(analysis)
    settings = ANALYSIS_SETTINGS[analysis]
    entry = _timing_entry(analysis, CLUSTER.get("gpu_kind"))
    if entry is None:
        key = timing.timing_key(run_config, settings, device_kind="")
        raise ValueError(
            f"no timing profile covers analysis {analysis} ({key}); run "
            "`snakemake --profile <profile> calibrate` on the target node first, or set "
            "cluster.walltime_hours to request an explicit walltime"
        )
    workers = run_config.training.workers if settings.consensus else 0
    return timing.estimate_seconds(
        run_config, settings, entry["seconds"], workers=workers if workers > 1 else 0
    )


_CALIBRATION_PENDING = {}


def calibration_pending(analysis):
    """Whether the walltime estimate of an analysis waits for its calibration job: walltimes are
    estimated and no timing entry (committed, or measured by an earlier calibration of any
    analysis with the same setup) covers it yet."""
    if analysis not in _CALIBRATION_PENDING:
        pending = False
        if CLUSTER.get("walltime") == "estimate" and not CLUSTER.get("walltime_hours"):
            pending = _timing_entry(analysis, CLUSTER.get("gpu_kind")) is None
        _CALIBRATION_PENDING[analysis] = pending
    return _CALIBRATION_PENDING[analysis]


def get_calibration(wildcards):
    """The calibration an analysis job's walltime waits for (none when a timing entry exists)."""
    if calibration_pending(wildcards.analysis):
        return [f"results/timing/{wildcards.analysis}.json"]
    return []


def _explicit_minutes(analysis):
    """cluster.walltime_hours as minutes per state job, split over its group's jobs: each case
    gets an equal share, finish_state the rest (at least one minute; none is ever 0)."""
    total = int(CLUSTER["walltime_hours"] * 60)
    cases = len(get_cases(analysis))
    share = max(1, (total - 1) // cases)
    return share, max(1, total - cases * share)


def get_analyze_runtime(wildcards):
    """Minutes for one (state, case): 2 x estimated work; the group's rounding and the 30-minute
    margin are carried by finish_state (see get_finish_runtime). Analysis jobs exist only after
    the index, which waits for a pending calibration, so its timings are there."""
    if CLUSTER.get("walltime_hours"):
        return _explicit_minutes(wildcards.analysis)[0]
    work = _case_work_seconds(wildcards.analysis)
    return 60 if work is None else math.ceil(2 * work / 60)


def get_finish_runtime(wildcards):
    """Completes the group of one state to 2 x work + 30 min, rounded up to the hour (<= 72 h):
    a group job's runtime is the sum of its jobs' runtimes (they run one after another).
    """
    if CLUSTER.get("walltime_hours"):
        return _explicit_minutes(wildcards.analysis)[1]
    work = _case_work_seconds(wildcards.analysis)
    if work is None:
        return 5
    cases = len(get_cases(wildcards.analysis))
    return timing.job_minutes(cases * work) - cases * math.ceil(2 * work / 60)


def get_attempt(wildcards, attempt):
    """Snakemake's attempt number (1 + retries so far), recorded in each result."""
    return attempt


# --- cost before a run -------------------------------------------------------------------


def _cost_line(analysis):
    """What an unfinished analysis will cost: jobs, the work of each, and the estimated time."""
    entry = ANALYSES[analysis]
    settings = ANALYSIS_SETTINGS[analysis]
    try:
        run_config = _analysis_run_config(analysis)
    except (
        ValueError
    ):  # an existing run without resolved.yaml: refused later, with its reason
        return None
    states = plan.expected_states(
        run_config,
        entry["run"],
        entry.get("checkpoints", "all"),
        analysis_dir=f"results/{analysis}",
    )
    workers = run_config.training.workers if settings.consensus else 0
    work = plan.case_work(run_config, settings, workers)
    device = settings.device
    kind = "cpu" if device == "cpu" else CLUSTER.get("gpu_kind") or "cuda"
    measured = _timing_entry(analysis, kind)
    return plan.cost_line(
        analysis, states, get_cases(analysis), work, device, measured, CLUSTER
    )


def _walltime_rule():
    if CLUSTER.get("walltime_hours"):
        return f"cluster.walltime_hours: {CLUSTER['walltime_hours']} per state job"
    if CLUSTER.get("walltime") == "estimate":
        return "2 x estimated work + 30 min per state job, rounded up to the hour"
    return "none (local run, or the profile's default)"


onstart:
    reattach(workflow.dag, CLUSTER.get("reattach_poll_seconds", 30))
    # The campaign record: one start event per analysis and controller run (not in dry runs).
    for _name in ANALYSES:
        _settings = ANALYSIS_SETTINGS[_name]
        try:
            _entry = _timing_entry(_name, CLUSTER.get("gpu_kind"))
        except ValueError:
            _entry = None
        campaign.append_event(
            f"results/{_name}",
            {
                "event": "start",
                "command": sys.argv,
                "source": source_hash(),
                "cost": _cost_line(_name),
                "walltime": _walltime_rule(),
                "timing_entry": _entry,
                "settings": asdict(_settings),
            },
        )


if workflow.is_main_process:
    for _name in ANALYSES:
        if not Path(f"results/{_name}/summary.csv").exists():
            _line = _cost_line(_name)
            if _line:
                print(_line, file=sys.stderr)
