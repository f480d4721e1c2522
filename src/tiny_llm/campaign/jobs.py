"""How a workflow job reports: everything in its log file, and a failure as one line.

Every job script starts with :func:`job_log`: stderr and logging go to the job's log file, and an
exception that ends the job writes its traceback there followed by one last line
``error: <message>``, in which command-line flags are replaced by the configuration keys that set
them in the workflow (``--hvp-batch-size`` -> ``analyses.<name>.settings.hvp_batch_size``). When
the workflow fails, :func:`failed_jobs` reads Snakemake's log for the jobs that failed and
returns one line per job with that message, which the workflow prints last.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "ERROR_PREFIX",
    "config_keys",
    "failed_jobs",
    "job_log",
    "print_failed_jobs",
    "refuse",
    "refusing",
    "print_cost_lines",
    "requested_minutes",
    "set_up_process",
    "uses_devices",
]

ERROR_PREFIX = "error: "
_FLAG = re.compile(r"--([a-z][a-z0-9-]*)")


def set_up_process(workflow: Any, on_interrupt: str) -> None:
    """What each Snakemake process of a run sets up first. The controller: the plugin's view of
    Slurm states and of Ctrl-C (:mod:`tiny_llm.campaign.slurm_states`), and the frozen copy of
    tiny_llm that every job of the run imports, Slurm jobs starting hours later included (editing
    the checkout meanwhile neither changes nor blocks them). A process that runs a cluster job's
    rules: marks them, so that the (state, case) jobs it starts side by side take the job's
    devices one at a time (:func:`tiny_llm.runtime.devices_of_the_job`)."""
    import os

    if workflow.is_main_process:
        from tiny_llm.campaign.slurm_states import keep_running_jobs_on_interrupt, normalise_plugin_states
        from tiny_llm.provenance import use_frozen_source

        normalise_plugin_states()
        keep_running_jobs_on_interrupt(on_interrupt)
        use_frozen_source(".snakemake/tiny-llm-source")
    elif workflow.remote_exec:
        from tiny_llm.runtime import GROUP_JOB

        os.environ.setdefault(GROUP_JOB, os.environ.get("SLURM_JOB_ID", str(os.getpid())))


def _fields(kind: str) -> set[str]:
    if kind == "settings":
        from tiny_llm.workers.settings import AnalysisSettings

        return set(AnalysisSettings.__dataclass_fields__)
    from tiny_llm.workers.spectrum import SpectrumSettings

    return set(SpectrumSettings.__dataclass_fields__)


def config_keys(message: str, analysis: str | None) -> str:
    """``message`` with the command-line flags a workflow user does not type replaced by the
    configuration keys that set them.

    Example:
        >>> config_keys("lower --hvp-batch-size, or use --device cpu", "demo")
        'lower analyses.demo.settings.hvp_batch_size, or use analyses.demo.settings.device cpu'
        >>> config_keys("use --device cpu", None)
        'use train_device cpu'
    """

    def key(match: re.Match) -> str:
        name = match.group(1).replace("-", "_")
        if analysis is None:
            return "train_device" if name == "device" else match.group(0)
        for kind in ("settings", "spectrum"):
            if name in _fields(kind):
                return f"analyses.{analysis}.{kind}.{name}"
        return match.group(0)

    return _FLAG.sub(key, message)


def job_log(snakemake: Any, mode: str = "w") -> None:
    """Send the job's stderr and logging to its log file, and make an exception that ends the job
    write its traceback there, then ``error: <one line naming config keys>``."""
    sys.stderr = open(snakemake.log[0], mode)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    analysis = dict(snakemake.wildcards.items()).get("analysis")

    def report(kind, error, trace) -> None:
        traceback.print_exception(kind, error, trace, file=sys.stderr)
        message = " ".join(str(error).split()) or kind.__name__
        if not isinstance(error, ValueError):
            message = f"{kind.__name__}: {message}"
        print(f"{ERROR_PREFIX}{config_keys(message, analysis)}", file=sys.stderr, flush=True)

    sys.excepthook = report


_RULE_ERROR = re.compile(r"^Error in rule (\S+):$")
_HASH = re.compile(r"[0-9a-f]{64}")


def failed_jobs(snakemake_log: str | Path | list) -> list[str]:
    """One line per job that failed in this Snakemake run (from its main log, or logs): the rule,
    its wildcards, the last ``error:`` line of the job's log (or where to look), and the log."""
    lines = []
    for path in snakemake_log if isinstance(snakemake_log, (list, tuple)) else [snakemake_log]:
        try:
            lines += Path(path).read_text(errors="replace").splitlines()
        except (OSError, TypeError):
            continue
    failed, i = [], 0
    while i < len(lines):
        match = _RULE_ERROR.match(lines[i].strip())
        if not match:
            i += 1
            continue
        rule, output, log = match.group(1), "", None
        i += 1
        while i < len(lines) and lines[i].startswith((" ", "\t")):
            field, _, value = lines[i].strip().partition(": ")
            if field == "output":
                output = _HASH.sub(lambda m: m.group(0)[:12] + "…", value.split(", ")[0])
            elif field == "log":
                log = value.split(" (check log")[0].strip()
            i += 1
        message = None
        if log and Path(log).exists():
            errors = [x for x in Path(log).read_text(errors="replace").splitlines() if x.startswith(ERROR_PREFIX)]
            message = errors[-1].removeprefix(ERROR_PREFIX) if errors else None
        where = f" {output}" if output else ""
        failed.append(f"{rule}{where}: {message or 'failed without a message'}" + (f" [log: {log}]" if log else ""))
    return failed


def print_failed_jobs(snakemake_log: str | Path | list) -> None:
    """Print :func:`failed_jobs` to stderr (the workflow's ``onerror``)."""
    failed = failed_jobs(snakemake_log)
    if failed:
        print(f"{len(failed)} job(s) failed:", *(f"  {line}" for line in failed), sep="\n", file=sys.stderr)


def refuse(message: object) -> None:
    """Stop the workflow before any job: one line ``error: <message>`` naming the config key,
    exit status 2, nothing written."""
    print(f"{ERROR_PREFIX}{message}", file=sys.stderr)
    sys.exit(2)


@contextlib.contextmanager
def refusing() -> Iterator[None]:
    """:func:`refuse` with the message of a ``ValueError`` raised inside the block."""
    try:
        yield
    except ValueError as error:
        refuse(error)


def requested_minutes(workflow: Any, rule: str) -> int | None:
    """The walltime (minutes) a profile's ``set-resources`` gives ``rule``'s jobs, or None."""
    resources = workflow.resource_settings.overwrite_resources.get(rule)
    try:
        value = resources["runtime"]
    except (KeyError, TypeError, IndexError):
        return None
    value = getattr(value, "value", value)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def print_cost_lines(plan: Any, workflow: Any) -> None:
    """Print what planning left out (``note: ...``) and the plan's cost lines before any job, with
    the walltimes the profile gives training and calibration jobs (counted in a cluster campaign's
    total), and where the jobs are charged; a profile that gives a job of several ranks fewer CPUs
    is refused first (:func:`check_rank_cpus`)."""
    for note in plan.runs.notes:
        print(f"note: {note}", file=sys.stderr)
    with refusing():  # a plan no partition can run (packed jobs beyond its walltime) stops here
        lines = plan.costs.cost_lines(
            requested_minutes(workflow, "train_run"), requested_minutes(workflow, "calibrate_timing")
        )
        check_rank_cpus(plan, workflow)
    for line in [*lines, *charged_lines(workflow)]:
        print(line, file=sys.stderr)


def check_rank_cpus(plan: Any, workflow: Any) -> None:
    """A job of several ranks must be given a CPU per rank: a profile that gives analysis jobs a fixed
    ``cpus_per_task`` below an analysis's ``gpus_per_job`` is refused, naming both (``cpus_per_task:
    0`` with ``cpus_per_gpu`` scales with the ranks).

    Raises:
        ValueError: naming the analysis's key, the profile's value and what to set.
    """
    settings = workflow.resource_settings
    own = settings.overwrite_resources.get("analyze_state")
    cpus = _resource(own, "cpus_per_task") if own is not None else None
    cpus = cpus if cpus is not None else _resource(settings.default_resources, "cpus_per_task")
    try:
        cpus = int(cpus)
    except (TypeError, ValueError):
        return  # none given, or computed per job
    for name in plan.analyses:
        gpus = plan.ranks(name)["gpus"]
        if 0 < cpus < gpus:
            raise ValueError(
                f"analyses.{name}.gpus_per_job: {gpus} ranks per node, but the profile gives analyze_state "
                f"cpus_per_task: {cpus}, fewer CPUs than ranks; set cpus_per_task: 0 and cpus_per_gpu (set-resources), "
                f"or cpus_per_task of at least {gpus}"
            )


def _resource(resources: Any, name: str) -> Any:
    """The value ``resources`` (a profile's mapping, or Snakemake's parsed one) give ``name``."""
    try:
        value = resources[name]
    except (KeyError, TypeError, IndexError):
        return None
    value = getattr(value, "raw", value)  # as the profile wrote it (Snakemake evaluates it per job)
    return value.strip("'\"") if isinstance(value, str) else value


def charged_lines(workflow: Any) -> list[str]:
    """Where Slurm jobs are charged: the ``slurm_account`` and ``slurm_partition`` the profile's
    ``default-resources`` give every job, and each rule that ``set-resources`` gives others; nothing
    where no profile names them (a local run)."""
    settings = workflow.resource_settings
    default = {name: _resource(settings.default_resources, name) for name in ("slurm_account", "slurm_partition")}
    if not any(default.values()):
        return []
    lines = [
        f"Slurm: jobs are charged to account {default['slurm_account'] or '(the cluster default)'}, partition "
        f"{default['slurm_partition'] or '(the cluster default)'} (the profile's default-resources; "
        "change them there)"
    ]
    for rule, resources in sorted(settings.overwrite_resources.items()):
        own = {name: _resource(resources, name) for name in default}
        changed = {name: value for name, value in own.items() if value and value != default[name]}
        if changed:
            lines.append(f"Slurm: {rule} jobs: " + ", ".join(f"{k}={v}" for k, v in changed.items()))
    return lines


def remember_signatures(namespace: dict[str, Any]) -> None:
    """Give every input function of the workflow (``get_*``) its signature once: Snakemake asks for
    it at every call otherwise (``inspect.signature``, a third of planning a suite of thousands of
    jobs), through its own ``overwrite_function_params``."""
    import inspect

    for name, value in list(namespace.items()):
        if name.startswith("get_") and inspect.isfunction(value):
            remember_signature(value)
    # And the resources' own evaluators (the profile's values are expressions evaluated per job).
    with contextlib.suppress(ImportError, AttributeError):
        from snakemake.resources import Resource

        remember_signature(Resource.evaluate)
        for rule in namespace["workflow"].rules:
            for resource in rule.resources.values():
                if inspect.isfunction(resource._evaluator):
                    remember_signature(resource._evaluator)


def remember_signature(function: Callable) -> Callable:
    """``function``, carrying its signature for Snakemake (see :func:`remember_signatures`)."""
    import inspect

    try:
        from snakemake.common import overwrite_function_params
    except ImportError:  # another Snakemake: it inspects them itself
        return function
    overwrite_function_params(function, inspect.signature(function).parameters)
    return function


def branch_runtime(plan: Any, workflow: Any, run: str) -> int:
    """Minutes a critical-batch branch run asks for: the profile's train_run runtime scaled by the
    branch's tokens (an hour where the profile gives none)."""
    from tiny_llm.campaign.cbs import branch_plans

    base = requested_minutes(workflow, "train_run")
    return 60 if base is None else branch_plans(plan.cbs)[run].branch_minutes(base)


def uses_devices(dag: Any) -> tuple[bool, set[str]]:
    """What the jobs this run will execute compute on a device: whether it trains, and which
    analyses it measures or collects (the measurements of an analysis appear in the DAG only after
    its index, so any job of the analysis but its index counts)."""
    trains, analyses = False, set()
    for job in dag.needrun_jobs():
        name, wildcards = job.rule.name, job.wildcards_dict
        trains = trains or name in ("train_run", "train_branch")
        if "analysis" in wildcards and name != "index_states":
            analyses.add(wildcards["analysis"])
    return trains, analyses
