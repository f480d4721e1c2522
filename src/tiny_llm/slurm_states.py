"""Slurm job states as the Slurm executor plugin expects them.

sacct reports a job that a user cancelled as ``CANCELLED by <uid>``. snakemake-executor-plugin-slurm
2.8.0, the newest release, compares states exactly, so it takes such a job for one still running
and the controller waits for it forever. :func:`normalise_plugin_states` wraps the plugin's status
query so that each state is its first word (``CANCELLED by 1000`` -> ``CANCELLED``): the job is
then reported failed and retried like any failed job. The workflow applies it in the Snakemake
process that submits jobs; it changes nothing else.
"""

from __future__ import annotations

import functools
import importlib

__all__ = ["first_words", "normalise_plugin_states"]


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
