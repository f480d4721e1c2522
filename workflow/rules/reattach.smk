# Re-attaching to the Slurm jobs of an earlier controller (a lost login session, SIGKILL, Ctrl-C).
# A result that such a job, still running, is computing is the output of a local job that waits
# for it (tiny_llm.campaign.slurm_jobs), not of a new Slurm job. These rules apply only to such outputs
# (elsewhere their input is a file that no rule makes, so the ordinary rules apply). Their inputs
# and params equal those of the rules they stand in for, so the finished result is recorded as if
# made by them and a later run reuses it. Their outputs are marked update(): Snakemake would
# otherwise delete a result that the earlier job has already written before the waiting job starts.
# Only the controller has them (a Slurm job's own Snakemake runs exactly the jobs it was given).
import functools

from tiny_llm.campaign import slurm_jobs
from tiny_llm.campaign.slurm_jobs import STANDS_IN, awaited_outputs


@functools.cache
def earlier_jobs():
    """Active Slurm jobs of earlier controllers in this directory. Looked up once, while the DAG
    is built, and only by a run that submits to Slurm (not a dry run, not a local run).
    """
    if not workflow.is_main_process or workflow.local_exec or workflow.dryrun:
        return []
    found, warnings = slurm_jobs.earlier_jobs(Path.cwd())
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return found


@functools.cache
def awaited():
    return awaited_outputs(earlier_jobs(), ANALYSES)


def _output(wildcards, stage, name):
    case = name or wildcards.case
    return f"results/{wildcards.analysis}/{stage}/{wildcards.key}/{case}.json"


def _when_awaited(stage, function, name=None):
    """The stood-in rule's input when an earlier job writes this output, else a file that no
    rule makes (so that the ordinary rule applies)."""

    def get_awaited_input(w):
        return function(w) if _output(w, stage, name) in awaited() else NOT_AWAITED

    return jobs.remember_signature(get_awaited_input)


def _earlier_job(stage, name=None):
    def get_earlier_job(wildcards):
        return awaited().get(_output(wildcards, stage, name), "")

    return jobs.remember_signature(get_earlier_job)


def reattach(dag, poll_seconds):
    """At the start of a run: the earlier controllers' jobs that this run needs, settled."""
    needed = {
        (
            STANDS_IN.get(job.rule.name, job.rule.name),
            tuple(sorted(job.wildcards_dict.items())),
        )
        for job in dag.needrun_jobs()
    }
    slurm_jobs.reattach(earlier_jobs(), needed, awaited(), poll_seconds)


if workflow.is_main_process:

    rule await_result:
        input:
            checkpoint=_when_awaited("states", get_state_checkpoint),
            timing=_when_awaited("states", get_calibration),
        output:
            result=update("results/{analysis}/states/{key}/{case}.json"),
        log:
            "logs/await_earlier_job/{analysis}/{key}/{case}.log",
        localrule: True
        conda:
            "../../envs/tiny-llm.yaml"
        resources:
            earlier_job=_earlier_job("states"),
            poll_seconds=str(CLUSTER.reattach_poll_seconds),
        params:
            run=get_analysis_run,
            settings=get_analysis_settings,
            aliases=get_state_aliases,
            order=get_case_order,
            successor=get_successor,
        script:
            "../scripts/await_earlier_job.py"

    rule await_receipt:
        input:
            results=_when_awaited("states", get_state_results, "done"),
            timing=_when_awaited("states", get_calibration, "done"),
        output:
            receipt=update("results/{analysis}/states/{key}/done.json"),
        log:
            "logs/await_earlier_job/{analysis}/{key}/done.log",
        localrule: True
        conda:
            "../../envs/tiny-llm.yaml"
        resources:
            earlier_job=_earlier_job("states", "done"),
            poll_seconds=str(CLUSTER.reattach_poll_seconds),
        script:
            "../scripts/await_earlier_job.py"

    rule await_spectrum:
        input:
            checkpoint=_when_awaited("spectra", get_state_checkpoint),
        output:
            result=update("results/{analysis}/spectra/{key}/{case}.json"),
        log:
            "logs/await_earlier_job/{analysis}/spectra/{key}/{case}.log",
        localrule: True
        conda:
            "../../envs/tiny-llm.yaml"
        resources:
            earlier_job=_earlier_job("spectra"),
            poll_seconds=str(CLUSTER.reattach_poll_seconds),
        params:
            run=get_analysis_run,
            settings=get_analysis_settings,
            spectrum=get_spectrum_settings,
            aliases=get_state_aliases,
            successor=get_successor,
            order=get_case_order,
        script:
            "../scripts/await_earlier_job.py"

    ruleorder: await_result > analyze_state
    ruleorder: await_receipt > finish_state
    ruleorder: await_spectrum > analyze_spectrum
