"""A cancelled job's sacct state reaches the Slurm plugin as CANCELLED (not "CANCELLED by <uid>")."""

import asyncio

import snakemake_executor_plugin_slurm as plugin

from tiny_llm.campaign.slurm_states import first_words, normalise_plugin_states


def test_states_are_reduced_to_their_first_word():
    assert first_words({"1": "CANCELLED by 1000", "2": "RUNNING", "3": "COMPLETED", "4": ""}) == {
        "1": "CANCELLED",
        "2": "RUNNING",
        "3": "COMPLETED",
        "4": "",
    }


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


class _Job:
    def __init__(self, job_id):
        self.external_jobid = job_id


def _interrupt(monkeypatch, tmp_path, policy, states):
    """Apply the Ctrl-C policy to the plugin's executor (restored after the test) and press Ctrl-C
    with jobs 7 (running), 8 (queued) and 9 (gone); returns what was cancelled and the executor."""
    import tiny_llm.campaign.slurm_states as slurm_states

    cancelled = []
    monkeypatch.setattr(
        plugin.Executor, "cancel_jobs", lambda self, jobs: cancelled.extend(j.external_jobid for j in jobs)
    )
    monkeypatch.setattr(slurm_states, "_queue_states", lambda ids: states)
    assert slurm_states.keep_running_jobs_on_interrupt(policy)
    executor = object.__new__(plugin.Executor)
    executor._tmpdir = str(tmp_path / "tmp.jobscripts")
    (tmp_path / "tmp.jobscripts").mkdir()
    plugin.Executor.cancel_jobs(executor, [_Job("7"), _Job("8"), _Job("9")])
    return cancelled, executor


def test_ctrl_c_cancels_queued_jobs_and_leaves_running_ones(monkeypatch, tmp_path, capsys):
    cancelled, executor = _interrupt(monkeypatch, tmp_path, "keep-running", {"7": "RUNNING", "8": "PENDING"})
    assert cancelled == ["8", "9"]
    assert capsys.readouterr().err == (
        "Interrupted: 2 queued Slurm job(s) cancelled; 1 running job(s) keep running (7). Run the same command "
        "again to re-attach to them (their results are awaited, not recomputed), or stop them with: scancel 7\n"
    )
    # the job-script folder the running job checks for is not the one shutdown() removes
    assert executor._tmpdir != str(tmp_path / "tmp.jobscripts") and (tmp_path / "tmp.jobscripts").is_dir()


def test_ctrl_c_with_the_cancel_policy_or_nothing_running_cancels_everything(monkeypatch, tmp_path):
    cancelled, executor = _interrupt(monkeypatch, tmp_path, "cancel", {"7": "RUNNING", "8": "PENDING"})
    assert cancelled == ["7", "8", "9"] and executor._tmpdir == str(tmp_path / "tmp.jobscripts")
    (tmp_path / "b").mkdir()
    cancelled, executor = _interrupt(monkeypatch, tmp_path / "b", "keep-running", {"8": "PENDING"})
    assert cancelled == ["7", "8", "9"] and executor._tmpdir == str(tmp_path / "b/tmp.jobscripts")


def test_ctrl_c_during_a_status_check_still_finds_the_jobs(monkeypatch, tmp_path, capsys):
    """The executor takes its jobs out of its active list while it checks their status; a Ctrl-C
    in that moment still cancels the queued ones and keeps the running ones."""
    import tiny_llm.campaign.slurm_states as slurm_states

    cancelled = []
    monkeypatch.setattr(
        plugin.Executor, "cancel_jobs", lambda self, jobs: cancelled.extend(j.external_jobid for j in jobs)
    )

    async def checking(self, active_jobs):  # Ctrl-C arrives while the status of the jobs is checked
        plugin.Executor.cancel_jobs(self, [])
        for job in active_jobs:
            yield job

    monkeypatch.setattr(plugin.Executor, "check_active_jobs", checking)
    monkeypatch.setattr(slurm_states, "_queue_states", lambda ids: {"7": "RUNNING", "8": "PENDING"})
    assert slurm_states.keep_running_jobs_on_interrupt("keep-running")
    executor = object.__new__(plugin.Executor)

    async def check():
        return [job async for job in plugin.Executor.check_active_jobs(executor, [_Job("7"), _Job("8")])]

    assert [job.external_jobid for job in asyncio.run(check())] == ["7", "8"]
    assert cancelled == ["8"]
    assert "1 queued Slurm job(s) cancelled; 1 running job(s) keep running (7)" in capsys.readouterr().err
    assert executor._tiny_llm_checking == []  # after the check, only the active list counts
