"""Finding an earlier controller's Slurm jobs, and waiting for one (Slurm's commands faked)."""

import subprocess

import pytest

from tiny_llm.campaign.slurm_jobs import (
    EarlierJob,
    awaited_outputs,
    cancel,
    earlier_jobs,
    job_state,
    parse_target_jobs,
    reattach,
    sort_earlier_jobs,
    wait_for_job,
)

SCRIPT = """#!/bin/sh
# This script was created by sbatch --wrap.

/venv/bin/python -m snakemake --snakefile '/repo/Snakefile' --target-jobs 'analyze_state:analysis=a,key=k1,case=seen' \
'finish_state:analysis=a,key=k1' --allowed-rules analyze_state finish_state --cores 1 --mode 'remote'
"""


class FakeSlurm:
    """squeue / scontrol / scancel / sacct answers from a table; records every call."""

    def __init__(self, queue="", scripts=None, states=None, final="COMPLETED"):
        self.queue, self.scripts, self.states, self.final = queue, scripts or {}, list(states or []), final
        self.calls = []

    def __call__(self, command, **kwargs):
        self.calls.append(command)
        out, rc = "", 0
        if command[:2] == ["squeue", "--me"]:
            out = self.queue
        elif command[:3] == ["scontrol", "write", "batch_script"]:
            out = self.scripts.get(command[3], "")
            rc = 0 if command[3] in self.scripts else 1
        elif command[0] == "squeue":
            out = self.states.pop(0) if self.states else ""
        elif command[0] == "sacct":
            out = self.final
        return subprocess.CompletedProcess(command, rc, out, "denied" if rc else "")


def test_target_jobs_are_read_from_the_batch_script():
    assert parse_target_jobs(SCRIPT) == [
        ("analyze_state", {"analysis": "a", "key": "k1", "case": "seen"}),
        ("finish_state", {"analysis": "a", "key": "k1"}),
    ]
    assert parse_target_jobs("#!/bin/sh\nsleep 100\n") == []


def test_only_active_jobs_of_this_directory_that_run_snakemake_targets(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    queue = "\n".join(
        [
            f"12|RUNNING|{tmp_path}",
            f"9|PENDING|{tmp_path}",
            f"13|RUNNING|{other}",
            f"14|COMPLETED|{tmp_path}",
            f"15|RUNNING|{tmp_path}",
            f"16|RUNNING|{tmp_path}",
        ]
    )
    slurm = FakeSlurm(queue, scripts={"12": SCRIPT, "9": SCRIPT, "13": SCRIPT, "15": "#!/bin/sh\nsleep 5\n"})
    jobs, warnings = earlier_jobs(tmp_path, runner=slurm)
    assert [(job.job_id, job.state, job.queued) for job in jobs] == [("9", "PENDING", True), ("12", "RUNNING", False)]
    assert jobs[1].targets[1] == ("finish_state", (("analysis", "a"), ("key", "k1")))
    assert len(warnings) == 1 and "Slurm job 16" in warnings[0] and "computed twice" in warnings[0]
    assert ["scontrol", "write", "batch_script", "13", "-"] not in slurm.calls  # another directory: not read


def test_a_failing_squeue_means_no_jobs_and_a_warning(tmp_path):
    def broken(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "slurm_load_jobs error")

    jobs, warnings = earlier_jobs(tmp_path, runner=broken)
    assert jobs == [] and "squeue failed (slurm_load_jobs error)" in warnings[0]


def test_waiting_ends_when_the_job_leaves_the_queue_and_its_outputs_exist(tmp_path):
    output = tmp_path / "seen.json"
    slurm = FakeSlurm(states=["SUSPENDED", "RUNNING", "RUNNING", ""])
    lines = []

    def sleep(seconds):
        if not slurm.states:
            output.write_text("{}")  # written as the job ends

    wait_for_job("12", [str(output)], poll_seconds=5, log=lines.append, runner=slurm, sleep=sleep)
    assert lines[:2] == ["Slurm job 12: SUSPENDED", "Slurm job 12: RUNNING"]  # each change once
    assert lines[-1] == f"Slurm job 12 wrote {output}"


def test_a_job_that_ends_without_its_outputs_is_an_error_with_its_state(tmp_path):
    slurm = FakeSlurm(states=["RUNNING", ""], final="TIMEOUT")
    with pytest.raises(
        RuntimeError,
        match=r"Slurm job 12, submitted by an earlier controller, ended \(TIMEOUT\) "
        r"without writing .*missing.json; run the same command again",
    ):
        wait_for_job(
            "12",
            [str(tmp_path / "missing.json")],
            poll_seconds=0,
            latency_seconds=0,
            log=lambda _: None,
            runner=slurm,
            sleep=lambda _: None,
        )


def test_job_state_and_cancel():
    assert job_state("5", runner=FakeSlurm(states=["RUNNING\n"])) == "RUNNING"
    assert job_state("5", runner=FakeSlurm(states=[""])) is None
    slurm = FakeSlurm()
    cancel(["5", "6"], runner=slurm)
    cancel([], runner=slurm)
    assert slurm.calls == [["scancel", "5", "6"]]

    def refused(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "Invalid job id")

    with pytest.raises(RuntimeError, match="scancel 5 failed: Invalid job id"):
        cancel(["5"], runner=refused)


def test_earlier_job_knows_whether_it_has_started():
    assert EarlierJob("1", "PENDING", ()).queued and not EarlierJob("1", "RUNNING", ()).queued


def test_reattaching_cancels_queued_work_awaits_results_and_waits_for_the_rest(capsys):
    """Of the earlier jobs that compute what this run needs: the queued one is cancelled, the one
    writing an awaited result is reported, the one training is waited for; others are left alone."""
    state = ("analyze_state", (("analysis", "a"), ("case", "seen"), ("key", "k1")))
    train = ("train_run", (("run", "r"),))
    jobs = [
        EarlierJob("1", "PENDING", (state,)),
        EarlierJob("2", "RUNNING", (state,)),
        EarlierJob("3", "RUNNING", (train,)),
        EarlierJob("4", "PENDING", (("collect", (("analysis", "b"),)),)),
    ]
    slurm = FakeSlurm(states=[""])
    reattach(jobs, {state, train}, {"results/a/states/k1/seen.json": "2"}, poll_seconds=0, runner=slurm)
    assert ["scancel", "1"] in slurm.calls and not any("4" in call for call in slurm.calls)
    err = capsys.readouterr().err
    assert "Cancelled 1 queued Slurm job(s) of an earlier controller (1)" in err
    assert "Re-attached to 1 running Slurm job(s) of an earlier controller (2)" in err
    assert "Waiting for Slurm job 3 of an earlier controller" in err


def test_the_workflow_awaits_only_what_an_earlier_running_job_writes(monkeypatch, tmp_path):
    """The stand-in rules' input functions: the ordinary input where a running job of an earlier
    controller writes the output (and its id), else a file no rule makes; a dry run looks nothing up."""
    from types import SimpleNamespace

    from tiny_llm.campaign.slurm_jobs import NOT_AWAITED, Reattachment

    monkeypatch.chdir(tmp_path)
    queue = f"7|RUNNING|{tmp_path}"
    slurm = FakeSlurm(queue=queue, scripts={"7": SCRIPT.replace("analysis=a", "analysis=b")})
    controller = SimpleNamespace(is_main_process=True, local_exec=False, dryrun=False)
    earlier = Reattachment(controller, ["b"], runner=slurm)
    wildcards = SimpleNamespace(analysis="b", key="k1", case="seen")
    assert earlier.when_awaited("states", lambda w: "ckpt")(wildcards) == "ckpt"
    assert earlier.earlier_job("states")(wildcards) == "7"
    other = SimpleNamespace(analysis="b", key="k2", case="seen")
    assert earlier.when_awaited("states", lambda w: "ckpt")(other) == NOT_AWAITED
    assert earlier.earlier_job("states")(other) == ""
    dry = Reattachment(SimpleNamespace(is_main_process=True, local_exec=False, dryrun=True), ["b"], runner=slurm)
    assert dry.jobs == [] and dry.awaited == {}


def test_earlier_jobs_are_awaited_cancelled_or_waited_for():
    state = ("analyze_state", (("analysis", "gpu"), ("case", "seen"), ("key", "k")))
    receipt = ("finish_state", (("analysis", "gpu"), ("key", "k")))
    other = ("analyze_state", (("analysis", "other"), ("case", "seen"), ("key", "k")))
    jobs = [
        EarlierJob("1", "RUNNING", (state, receipt)),
        EarlierJob("2", "PENDING", (state,)),
        EarlierJob("3", "RUNNING", (("train_run", (("run", "tiny"),)),)),
        EarlierJob("4", "RUNNING", (other,)),
    ]
    awaited = awaited_outputs(jobs, ["gpu"])
    assert awaited == {"results/gpu/states/k/seen.json": "1", "results/gpu/states/k/done.json": "1"}
    needed = {state, receipt, ("train_run", (("run", "tiny"),))}
    assert sort_earlier_jobs(jobs, needed, awaited) == (["2"], ["1"], ["3"])
    assert sort_earlier_jobs(jobs, set(), awaited) == ([], [], [])  # nothing this run needs: left alone
