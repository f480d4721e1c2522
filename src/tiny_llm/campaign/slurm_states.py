"""Slurm job states as the Slurm executor plugin expects them.

sacct reports a job that a user cancelled as ``CANCELLED by <uid>``. snakemake-executor-plugin-slurm
2.8.0, the newest release, compares states exactly, so it takes such a job for one still running
and the controller waits for it forever. :func:`normalise_plugin_states` wraps the plugin's status
query so that each state is its first word (``CANCELLED by 1000`` -> ``CANCELLED``): the job is
then reported failed and retried like any failed job.

On Ctrl-C the plugin cancels every job it submitted. A campaign user rarely wants hours of GPU
work thrown away by one keystroke, so :func:`keep_running_jobs_on_interrupt` makes Ctrl-C cancel
only the jobs still queued (they have done nothing yet) and leave running ones running; the next
controller re-attaches to them (:mod:`tiny_llm.campaign.slurm_jobs`). The workflow applies both wrappers in
the Snakemake process that submits jobs; they change nothing else.
"""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
import tempfile

__all__ = ["first_words", "keep_running_jobs_on_interrupt", "normalise_plugin_states"]


def first_words(states: dict[str, str]) -> dict[str, str]:
    """Each job's state reduced to its first word (the state proper, without sacct's details)."""
    return {job: state.split()[0] if state.strip() else state for job, state in states.items()}


def normalise_plugin_states() -> bool:
    """Wrap the installed plugin's status query (once); False when the plugin is not installed."""
    try:
        plugin = importlib.import_module("snakemake_executor_plugin_slurm")
    except ImportError:
        return False
    query = plugin.query_job_status
    if getattr(query, "normalised_states", False):
        return True

    @functools.wraps(query)
    async def normalised(*args, **kwargs):
        states, seconds = await query(*args, **kwargs)
        return (None if states is None else first_words(states)), seconds

    normalised.normalised_states = True
    plugin.query_job_status = normalised
    return True


def _queue_states(job_ids: list[str]) -> dict[str, str]:
    done = subprocess.run(
        ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        return {}
    return dict(line.split("|", 1) for line in done.stdout.split() if "|" in line)


def keep_running_jobs_on_interrupt(policy: str = "keep-running") -> bool:
    """On Ctrl-C, cancel only queued jobs (``policy`` "keep-running") or every job ("cancel").

    Returns False when the plugin is not installed. Applied once; a later call changes the policy.
    """
    try:
        plugin = importlib.import_module("snakemake_executor_plugin_slurm")
    except ImportError:
        return False
    executor = plugin.Executor
    cancel_all = getattr(executor.cancel_jobs, "__wrapped__", executor.cancel_jobs)
    check = getattr(executor.check_active_jobs, "__wrapped__", executor.check_active_jobs)

    @functools.wraps(check)
    async def check_active_jobs(self, active_jobs):
        # While their status is checked, jobs are out of the executor's active list: a Ctrl-C then
        # would find no job to cancel or keep. Remember them for cancel_jobs.
        self._tiny_llm_checking = list(active_jobs)
        try:
            async for job in check(self, active_jobs):
                yield job
        finally:
            self._tiny_llm_checking = []

    @functools.wraps(cancel_all)
    def cancel_jobs(self, active_jobs):
        active_jobs = list(active_jobs)
        active_jobs += [job for job in getattr(self, "_tiny_llm_checking", []) if job not in active_jobs]
        ids = [job.external_jobid for job in active_jobs if job.external_jobid]
        states = _queue_states(ids) if ids and policy == "keep-running" else {}
        running = sorted(
            (job_id for job_id in ids if states.get(job_id) not in (None, "PENDING")),
            key=lambda job_id: (len(job_id), job_id),
        )
        if not running:
            return cancel_all(self, active_jobs)
        queued = [job for job in active_jobs if job.external_jobid not in running]
        if queued:
            cancel_all(self, queued)
        if getattr(self, "_tmpdir", None):
            # A job checks, as it starts, that the controller's job-script folder exists; shutdown()
            # would delete it and fail a job just starting. It stays; a fresh empty one goes instead.
            self._tmpdir = tempfile.mkdtemp(dir=os.path.dirname(self._tmpdir), prefix="tmp.")
        # Straight to stderr: Snakemake's logging may already be shutting down after Ctrl-C.
        print(
            f"Interrupted: {len(queued)} queued Slurm job(s) cancelled; {len(running)} running job(s) keep "
            f"running ({' '.join(running)}). Run the same command again to re-attach to them (their "
            f"results are awaited, not recomputed), or stop them with: scancel {' '.join(running)}",
            file=sys.stderr,
            flush=True,
        )

    executor.cancel_jobs = cancel_jobs
    executor.check_active_jobs = check_active_jobs
    return True
