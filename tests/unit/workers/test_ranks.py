"""Running a job on several ranks: the launch command on one node and over several (srun, torchrun's
rendezvous on the allocation's first node, the job step's variables unset), and a launcher that
stops with its job."""

import sys
from pathlib import Path

import pytest

from tiny_llm.workers import ranks
from tiny_llm.workers.ranks import STEP_VARIABLES, launch_command


def test_one_node_runs_torchrun_standalone():
    command = launch_command(Path("spec.json"), 4)
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[3:6] == ["--standalone", "--nproc-per-node", "4"]
    assert command[-3:] == ["-m", "tiny_llm.workers.ranks", "spec.json"]


def test_several_nodes_run_one_torchrun_a_node_meeting_on_the_first(monkeypatch):
    monkeypatch.setattr(ranks, "allocation_nodes", lambda: ["node7", "node8"])
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    command = launch_command(Path("spec.json"), 4, nodes=2)
    assert command[0] == "env" and all(f"--unset={name}" in command for name in STEP_VARIABLES)
    srun = command[command.index("srun") :]
    assert srun[srun.index("--nodes") + 1] == "2" and srun[srun.index("--ntasks-per-node") + 1] == "1"
    assert "--overlap" in srun and "--kill-on-bad-exit=1" in srun
    assert srun[srun.index("--rdzv-endpoint") + 1].startswith("node7:") and srun[srun.index("--rdzv-id") + 1] == "123"
    assert srun[srun.index("--nproc-per-node") + 1] == "4" and srun[srun.index("--nnodes") + 1] == "2"


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an exited child nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


_LAUNCHER = """
import os, sys
from tiny_llm.workers.ranks import _launch
child = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)",
         sys.argv[1]]
_launch(child, dict(os.environ))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_stopping_a_job_stops_what_it_launched(tmp_path, signal_name):
    """A job's launcher (torchrun, whose ranks do the same) stops with the job: SIGTERM is passed
    on, and on SIGKILL the kernel sends the parent-death signal."""
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "child.pid"
    job = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(pid_file)])
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert _alive(child)
    job.send_signal(getattr(signal, signal_name))
    job.wait(timeout=30)
    deadline = time.time() + 20
    while _alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(child)
