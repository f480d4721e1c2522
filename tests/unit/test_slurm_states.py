"""A cancelled job's sacct state reaches the Slurm plugin as CANCELLED (not "CANCELLED by <uid>")."""

import asyncio

import snakemake_executor_plugin_slurm as plugin

from tiny_llm.slurm_states import first_words, normalise_plugin_states


def test_states_are_reduced_to_their_first_word():
    assert first_words({"1": "CANCELLED by 1000", "2": "RUNNING", "3": "COMPLETED", "4": ""}) == {
        "1": "CANCELLED", "2": "RUNNING", "3": "COMPLETED", "4": ""}


def test_the_plugins_status_query_is_wrapped_once(monkeypatch):
    async def fake(command, logger):
        return {"7": "CANCELLED by 0", "8": "PENDING"}, 0.5
    monkeypatch.setattr(plugin, "query_job_status", fake)
    assert normalise_plugin_states() and normalise_plugin_states()
    wrapped = plugin.query_job_status
    assert wrapped.normalised_states and getattr(wrapped, "__wrapped__", None) is fake  # not wrapped twice
    assert asyncio.run(wrapped("sacct", None)) == ({"7": "CANCELLED", "8": "PENDING"}, 0.5)


def test_a_failed_query_stays_failed(monkeypatch):
    async def failing(command, logger):
        return None, None
    monkeypatch.setattr(plugin, "query_job_status", failing)
    normalise_plugin_states()
    assert asyncio.run(plugin.query_job_status("sacct", None)) == (None, None)
